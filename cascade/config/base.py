"""What every section of the schema shares: the strict base model and the domain names."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints

VerifierKind = Literal["math", "code", "if", "swe", "rlhf", "agent", "python"]
"""The verifiers in `cascade.domains`; `python` is a user's own reward function."""
BUILTIN_DOMAINS: tuple[str, ...] = ("math", "code", "if", "swe", "rlhf", "agent")
"""Verifier kinds that are also domain names: a domain named so needs no `verifier:`."""
DomainName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,39}$")]
"""A domain's name, free (`gsm8k`, `math-hard`): lowercase letters, digits, `_` and `-`, at most 40
characters, starting with a letter (it names files, metric labels and stream keys)."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

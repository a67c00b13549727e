"""What every section of the schema shares: the strict base model and the domain names."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

DomainName = Literal["math", "code", "if", "swe", "rlhf", "agent"]
"""Domains with a verifier in `cascade.domains`."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

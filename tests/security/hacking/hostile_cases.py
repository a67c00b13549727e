"""The shape of a hostile completion, shared by every domain's reward-hacking corpus.

Each domain's corpus module (`corpus_<domain>.py` beside this file) lists `CASES` (hostile
completions with the verdicts a fair judge may give them) and `RIGHT` (correct completions
for the same kind of problem, which must still earn full reward after the hostile ones in the
same run). The domain's own test scores them through `score_batch` as training does;
`test_reward_service_hacks.py` scores every corpus again through the gRPC reward service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cascade.domains.base import INFRA_ERROR, Problem


@dataclass(frozen=True)
class HostileCase:
    """One completion built to be paid without being right (or to break the verifier)."""

    name: str
    problem: Problem
    completion: str
    allowed: frozenset[str]
    """Verdict reasons a fair judge may give; never `infra_error`."""
    max_reward: float = 0.0
    """The most it may earn (0 for every case that is simply wrong; -1 for SWE's unparsable)."""
    reward_config: dict[str, Any] = field(default_factory=dict)
    """The domain's reward config (as the service's `reward_config_json`); empty: defaults."""

    def __post_init__(self) -> None:
        if INFRA_ERROR in self.allowed:
            raise ValueError(f"{self.name}: infra_error is never a fair verdict on a completion")

    @property
    def domain(self) -> str:
        return self.problem.domain


@dataclass(frozen=True)
class RightCase:
    """A correct completion that must earn `reward` after the hostile ones."""

    name: str
    problem: Problem
    completion: str
    reward: float = 1.0
    reward_config: dict[str, Any] = field(default_factory=dict)

    @property
    def domain(self) -> str:
        return self.problem.domain


def failures(cases: list[HostileCase], verdicts: list[Any]) -> list[str]:
    """The cases whose verdict pays too much, is unfair, or is the verifier's own failure."""
    out = []
    for case, verdict in zip(cases, verdicts, strict=True):
        if (
            verdict.reason == INFRA_ERROR
            or verdict.reason not in case.allowed
            or verdict.reward > case.max_reward
        ):
            out.append(f"{case.name}: {verdict.reward} {verdict.reason} {verdict.detail[:200]!r}")
    return out

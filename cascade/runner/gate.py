"""The regression gate's decision: which guarded domains have fallen below their best checkpoint
by more than the eval's noise, with the evidence (`stages[].gate`, docs/algorithm.md).

A domain has fallen when its latest eval's interval lies wholly below its best checkpoint's
(`outside_noise`, the regression table's own test), and is back once the two overlap again. A
domain without a best checkpoint or without intervals is never called fallen: the gate acts on
evidence, not on point estimates."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cascade.eval.results import DomainEval
from cascade.eval.stats import outside_noise
from cascade.runner.curriculum import TeacherEntry


@dataclass(frozen=True)
class Fallen:
    """One domain's evidence: its best checkpoint (step, score, interval) and its latest eval."""

    domain: str
    best_step: int
    best: float
    best_low: float
    best_high: float
    now: float
    now_low: float
    now_high: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"{self.domain} {self.now:.1%} [{self.now_low:.1%}, {self.now_high:.1%}] below its best "
            f"{self.best:.1%} [{self.best_low:.1%}, {self.best_high:.1%}] (step {self.best_step})"
        )


def fallen_domains(
    guarded: list[str], evals: dict[str, DomainEval], best: dict[str, TeacherEntry | None]
) -> list[Fallen]:
    """The guarded domains whose latest eval (`evals`, primary metric with its interval) lies
    wholly below their best checkpoint's interval (`best`, the teacher registry's entries)."""
    out = []
    for domain in guarded:
        entry, result = best.get(domain), evals.get(domain)
        if entry is None or result is None or entry.low is None or entry.high is None:
            continue
        primary = result.metrics.get(result.primary)
        if primary is None:
            continue
        now = (primary.low, primary.high)
        if outside_noise(now, (entry.low, entry.high)):
            out.append(
                Fallen(
                    domain=domain,
                    best_step=entry.step,
                    best=entry.score,
                    best_low=entry.low,
                    best_high=entry.high,
                    now=result.score,
                    now_low=primary.low,
                    now_high=primary.high,
                )
            )
    return out

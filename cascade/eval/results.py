"""What an eval reports: each metric with its interval, and one domain's row of the regression
table. Plain data: the run store, the tracker and the report read them without running an eval."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class MetricValue:
    """One eval metric of one domain: its value, its interval and how the interval was made."""

    value: float
    low: float
    high: float
    n: int
    """Prompts the value averages over (infra errors left out)."""
    method: str
    """"wilson" (0/1 outcome per prompt) or "bootstrap" (mean of per-prompt values)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DomainEval:
    domain: str
    score: float  # the primary metric (greedy by default: accuracy for 0/1 rewards)
    n: int
    reasons: dict[str, int]
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    """Every configured metric (the primary one included), with its interval."""
    primary: str = "greedy"

    def metric(self, name: str | None) -> float:
        """The value of metric `name` (None: the primary score)."""
        if name is None or name == self.primary:
            return self.score
        if name not in self.metrics:
            raise KeyError(f"eval of {self.domain!r} has no metric {name!r} (has {sorted(self.metrics)})")
        return self.metrics[name].value

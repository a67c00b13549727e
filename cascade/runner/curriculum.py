"""Stage advance and teacher tracking: the two decisions a cascade makes between RL steps.

- `AdvanceTracker` decides when a stage is done: its eval metric has held at or above the
  rule's threshold for `patience` consecutive evals and at least `min_steps` stage steps have
  run (or `max_steps` is reached; an operator may also advance by REST, outside this class).
- `TeacherRegistry` remembers, per domain, the checkpoint with the best eval score of that
  domain (not the last one): those checkpoints are the distillation teachers of later stages.

Both are pure Python with JSON-able state, so they are saved and restored with the run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cascade.config import AdvanceRule


class AdvanceTracker:
    """Counts consecutive evals at or above `rule.threshold`; a dip below resets the count."""

    def __init__(self, rule: AdvanceRule) -> None:
        self.rule = rule
        self.streak = 0
        self.last_step: int | None = None
        self.history: list[tuple[int, float]] = []

    def should_advance(self, step: int) -> bool:
        """Whether the evals seen so far, at stage step `step`, satisfy the rule."""
        return self.streak >= self.rule.patience and step >= self.rule.min_steps

    def observe(self, step: int, value: float) -> bool:
        """Record one eval of the watched metric at stage step `step`; True = advance now.

        Steps must not go back. A second eval at the same step as the previous one (a periodic
        eval coinciding with a stage-end eval) is not counted again: the decision for that step
        is returned unchanged. A NaN value counts as below the threshold.
        """
        if self.last_step is not None and step < self.last_step:
            raise ValueError(f"eval at step {step} after one at step {self.last_step}")
        if step == self.last_step:
            return self.should_advance(step)
        value = float(value)
        self.streak = self.streak + 1 if value >= self.rule.threshold else 0
        self.last_step = step
        self.history.append((step, value))
        return self.should_advance(step)

    def reached_max(self, step: int) -> bool:
        """True once `step` stage steps have run and the stage must end regardless."""
        return step >= self.rule.max_steps

    def state_dict(self) -> dict[str, Any]:
        return {
            "streak": self.streak,
            "last_step": self.last_step,
            "history": [[s, v] for s, v in self.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state["streak"])
        last = state["last_step"]
        self.last_step = None if last is None else int(last)
        self.history = [(int(s), float(v)) for s, v in state["history"]]


@dataclass(frozen=True)
class TeacherEntry:
    """A domain's best checkpoint so far: where it is, its eval score, the step it was saved."""

    path: str
    score: float
    step: int
    low: float | None = None
    high: float | None = None
    """The score's interval (None: not known, e.g. a run saved before intervals were kept)."""


class TeacherRegistry:
    """Best checkpoint per domain by that domain's own eval score; ties keep the earlier one."""

    def __init__(self) -> None:
        self._best: dict[str, TeacherEntry] = {}

    def offer(
        self,
        domain: str,
        score: float,
        step: int,
        path: str | Path,
        interval: tuple[float, float] | None = None,
    ) -> bool:
        """Consider a checkpoint; True if it becomes the domain's teacher (strictly better).

        A NaN score is never accepted.
        """
        score = float(score)
        if math.isnan(score):
            return False
        current = self._best.get(domain)
        if current is not None and not score > current.score:
            return False
        low, high = interval if interval is not None else (None, None)
        self._best[domain] = TeacherEntry(path=str(path), score=score, step=int(step), low=low, high=high)
        return True

    def teacher(self, domain: str) -> TeacherEntry | None:
        return self._best.get(domain)

    def domains(self) -> list[str]:
        """Domains with a teacher, in the order they first got one."""
        return list(self._best)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: `{"teachers": {domain: {"path": str, "score": float, "step": int}}}`."""
        return {"teachers": {d: asdict(e) for d, e in self._best.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._best = {
            str(d): TeacherEntry(
                path=str(e["path"]),
                score=float(e["score"]),
                step=int(e["step"]),
                low=None if e.get("low") is None else float(e["low"]),
                high=None if e.get("high") is None else float(e["high"]),
            )
            for d, e in state["teachers"].items()
        }

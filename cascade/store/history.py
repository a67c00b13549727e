"""A run's history as plain data, and the regression table computed from it.

The report, the CLI and the control plane all need "how did each domain's score move across
the stages". Computing it from plain dataclasses (no session, no ORM rows) lets the report be
unit-tested without a database and lets a remote client build the same table from JSON.

Conventions (shared with the runner):
- a stage's `step` counts optimiser updates within the stage; an eval at step 0 of a stage is
  taken before that stage's first update;
- the cascade's **start** is the eval at step 0 of the first stage;
- **after <stage>** is the last eval of the domain recorded in that stage;
- **best** is the highest eval of the domain anywhere in the run (the teacher's score);
- **final - best** is the latest eval minus best: 0 means no forgetting, negative is the drop;
  the drop is **outside noise** when final's confidence interval lies wholly below best's
  (non-overlapping intervals; see `cascade.eval.stats`). Best is a maximum over many
  evals, so it is biased upwards: a small unflagged drop is expected noise.

Every score carries its interval when the eval recorded one (`EvalPoint.metrics`); the table
is of the primary metric by default, or of any recorded metric (`build_regression_table(...,
metric="pass@4")`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cascade.eval.stats import Interval, outside_noise


@dataclass(frozen=True)
class EvalPoint:
    stage_index: int
    step: int
    global_step: int
    domain: str
    score: float
    n: int
    reasons: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Metric -> {"value", "low", "high", "n", "method"}; the first is the primary (`score`)."""

    def _entry(self, metric: str | None) -> dict[str, Any] | None:
        if metric is None:
            return next(iter(self.metrics.values()), None)
        return self.metrics.get(metric)

    def value(self, metric: str | None = None) -> float | None:
        """The value of `metric` (None: the primary score); None when it was not recorded."""
        if metric is None:
            return self.score
        entry = self._entry(metric)
        return None if entry is None or entry.get("value") is None else float(entry["value"])

    def interval(self, metric: str | None = None) -> Interval | None:
        """The confidence interval of `metric` (None: the primary score), if recorded."""
        entry = self._entry(metric)
        if entry is None or entry.get("low") is None or entry.get("high") is None:
            return None
        return (float(entry["low"]), float(entry["high"]))


@dataclass(frozen=True)
class StepPoint:
    stage_index: int
    step: int
    global_step: int
    metrics: dict[str, Any]


@dataclass(frozen=True)
class StageSpan:
    """A stage and where it sits on the global-step axis (None when it never ran)."""

    index: int
    label: str
    domain: str
    state: str = "pending"
    start_global_step: int | None = None
    """Global step of the stage's step 0: where its boundary line is drawn."""
    end_global_step: int | None = None


@dataclass
class RunHistory:
    """Everything the report needs about one run, ordered by global step."""

    stages: list[StageSpan]
    evals: list[EvalPoint]
    steps: list[StepPoint] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    """Row order of the regression table; domains seen only in evals are appended."""
    run_id: int | None = None
    cascade_name: str = ""
    run_info: dict[str, Any] = field(default_factory=dict)
    """Seed, distill flag, status... carried into metrics.json as is."""

    def __post_init__(self) -> None:
        self.evals = sorted(self.evals, key=lambda e: (e.global_step, e.stage_index, e.step, e.domain))
        self.steps = sorted(self.steps, key=lambda s: (s.global_step, s.stage_index, s.step))
        seen = list(dict.fromkeys(self.domains))
        for e in self.evals:
            if e.domain not in seen:
                seen.append(e.domain)
        self.domains = seen
        self.stages = stage_spans(sorted(self.stages, key=lambda s: s.index), self.evals, self.steps)

    def stage_label(self, index: int) -> str:
        for s in self.stages:
            if s.index == index:
                return s.label
        return f"stage {index}"

    def evals_of(self, domain: str) -> list[EvalPoint]:
        return [e for e in self.evals if e.domain == domain]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "cascade": self.cascade_name,
            "run": self.run_info,
            "domains": self.domains,
            "stages": [asdict(s) for s in self.stages],
            "steps": [asdict(s) for s in self.steps],
            "evals": [asdict(e) for e in self.evals],
        }


def stage_spans(stages: list[StageSpan], evals: list[EvalPoint], steps: list[StepPoint]) -> list[StageSpan]:
    """Fill each stage's missing global-step span from its recorded steps and evals.

    A stage's step 0 sits at `global_step - step` of any of its points, so the boundary is
    exact even when no eval was taken at the stage's start. Spans already set are kept.
    """
    points: dict[int, list[tuple[int, int]]] = {}
    for stage_index, step, global_step in [
        *((e.stage_index, e.step, e.global_step) for e in evals),
        *((s.stage_index, s.step, s.global_step) for s in steps),
    ]:
        points.setdefault(stage_index, []).append((step, global_step))
    out = []
    for s in stages:
        mine = points.get(s.index)
        if not mine:
            out.append(s)
            continue
        start = s.start_global_step if s.start_global_step is not None else min(g - st for st, g in mine)
        end = s.end_global_step if s.end_global_step is not None else max(g for _, g in mine)
        out.append(replace(s, start_global_step=start, end_global_step=end))
    return out


def final_evals_by_stage(evals: list[EvalPoint]) -> dict[int, dict[str, EvalPoint]]:
    """stage index -> domain -> the last eval of that domain within that stage."""
    out: dict[int, dict[str, EvalPoint]] = {}
    for e in sorted(evals, key=lambda e: (e.stage_index, e.step, e.global_step)):
        out.setdefault(e.stage_index, {})[e.domain] = e
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class RegressionRow:
    domain: str
    start: float | None
    after: list[float | None]
    """One value per stage, aligned with `RegressionTable.stage_labels`."""
    best: float | None
    best_global_step: int | None
    final: float | None
    start_ci: Interval | None = None
    after_ci: list[Interval | None] = field(default_factory=list)
    """Intervals of `after`, aligned with it (empty when none was recorded)."""
    best_ci: Interval | None = None
    final_ci: Interval | None = None

    @property
    def final_minus_best(self) -> float | None:
        if self.final is None or self.best is None:
            return None
        return self.final - self.best

    @property
    def drop_outside_noise(self) -> bool | None:
        """True: final's interval lies wholly below best's; None: an interval is missing."""
        return outside_noise(self.final_ci, self.best_ci)


@dataclass(frozen=True)
class RegressionTable:
    """Domain x stage scores (fractions, not percentages)."""

    stage_labels: list[str]
    rows: list[RegressionRow]
    metric: str | None = None
    """The metric tabulated (None: each eval's primary score)."""

    @property
    def columns(self) -> list[str]:
        return ["domain", "start", *(f"after {label}" for label in self.stage_labels), "best", "final - best"]

    def row(self, domain: str) -> RegressionRow:
        for r in self.rows:
            if r.domain == domain:
                return r
        raise KeyError(domain)

    def to_dict(self) -> dict[str, Any]:
        return {
            "units": "fraction",
            "metric": self.metric,
            "noise_rule": NOISE_RULE,
            "columns": self.columns,
            "stages": self.stage_labels,
            "rows": [
                {
                    "domain": r.domain,
                    "start": r.start,
                    "after": dict(zip(self.stage_labels, r.after, strict=True)),
                    "best": r.best,
                    "best_global_step": r.best_global_step,
                    "final": r.final,
                    "final_minus_best": r.final_minus_best,
                    "start_ci": _ci(r.start_ci),
                    "after_ci": {
                        label: _ci(r.after_ci[i] if i < len(r.after_ci) else None)
                        for i, label in enumerate(self.stage_labels)
                    },
                    "best_ci": _ci(r.best_ci),
                    "final_ci": _ci(r.final_ci),
                    "drop_outside_noise": r.drop_outside_noise,
                }
                for r in self.rows
            ],
        }


NOISE_RULE = (
    "final - best is outside noise when final's confidence interval lies wholly below best's "
    "(non-overlapping intervals)"
)


def _ci(interval: Interval | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


def build_regression_table(history: RunHistory, metric: str | None = None) -> RegressionTable:
    """The regression table of `metric` (None: each eval's primary score), with intervals."""
    evals = [e for e in history.evals if e.value(metric) is not None]
    finals = final_evals_by_stage(evals)
    first_stage = history.stages[0].index if history.stages else min(finals, default=0)
    rows = []
    for domain in history.domains:
        mine = [e for e in evals if e.domain == domain]
        start_point = next((e for e in mine if e.stage_index == first_stage and e.step == 0), None)
        lasts = [finals.get(s.index, {}).get(domain) for s in history.stages]
        best = max(mine, key=lambda e: e.value(metric) or 0.0, default=None)
        final = mine[-1] if mine else None
        rows.append(
            RegressionRow(
                domain=domain,
                start=None if start_point is None else start_point.value(metric),
                after=[None if e is None else e.value(metric) for e in lasts],
                best=None if best is None else best.value(metric),
                best_global_step=None if best is None else best.global_step,
                final=None if final is None else final.value(metric),
                start_ci=None if start_point is None else start_point.interval(metric),
                after_ci=[None if e is None else e.interval(metric) for e in lasts],
                best_ci=None if best is None else best.interval(metric),
                final_ci=None if final is None else final.interval(metric),
            )
        )
    return RegressionTable(stage_labels=[s.label for s in history.stages], rows=rows, metric=metric)


def json_safe(value: Any) -> Any:
    """`value` as plain JSON: non-finite floats become None (JSON has no NaN and Postgres
    refuses it), numpy/torch scalars become Python numbers, paths become strings.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    dump = getattr(value, "model_dump", None)  # pydantic models (e.g. CascadeConfig)
    if callable(dump):
        return json_safe(dump(mode="json"))
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return json_safe(item())
        except (TypeError, ValueError):
            pass
    raise TypeError(f"cannot store a {type(value).__name__} as JSON: {value!r:.80}")

"""`Tracker`: what the stage loop calls at each step, eval, checkpoint and at the end; it fans out
to the configured backends and, with none configured, does nothing.

Names are the same in every backend: `train/<metric>` for the step's numbers (nested counts as
`train/reasons/<reason>`, the stage index as `train/stage`), `eval/<domain>/<metric>` with
`.../low` and `.../high` (the interval at the stage's `eval.confidence`) and `eval/<domain>/n`,
`regression/<domain>/<column>` at the end. The x-axis is the global step.

`tracking.json` in the run directory keeps each backend's run (MLflow run id, W&B id, the
TensorBoard directory); `--resume` reopens those runs, also those of backends no longer listed
(a run continues where it was tracked). A backend that fails mid-run is reported in the log and
the run goes on; one that cannot open fails the run at start.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade.config.tracking import BACKENDS, TrackingConfig
from cascade.tracking.base import Backend, RunContext, TrackingUnavailable, numeric, require

if TYPE_CHECKING:
    from cascade.config import CascadeConfig
    from cascade.eval.results import DomainEval

STATE_FILE = "tracking.json"
"""Each backend's tracked run, as `open` returned it (no secrets: URIs are masked)."""

_QUIET_AFTER = 3
"""Failures of one backend reported in full before the rest are only counted."""


def read_state(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = run_dir / STATE_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if k in BACKENDS and isinstance(v, dict)}


def make_backend(name: str, tracking: TrackingConfig) -> Backend:
    require(name)
    if name == "tensorboard":
        from cascade.tracking.tensorboard_backend import TensorBoardBackend

        return TensorBoardBackend(tracking.tensorboard)
    if name == "mlflow":
        from cascade.tracking.mlflow_backend import MlflowBackend

        return MlflowBackend(tracking.mlflow)
    from cascade.tracking.wandb_backend import WandbBackend

    return WandbBackend(tracking.wandb)


def check_tracking(tracking: TrackingConfig) -> list[str]:
    """One line per configured backend whose library is not installed (`cascade validate`)."""
    problems = []
    for name in tracking.backends:
        try:
            require(name)
        except TrackingUnavailable as err:
            problems.append(str(err))
    return problems


def regression_summary(report_dir: Path) -> dict[str, float]:
    """The regression table's numbers, flat: `regression/<domain>/<start|best|final|...>`."""
    path = report_dir / "regression_table.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    out: dict[str, float] = {}
    for row in data["rows"]:
        values: dict[str, Any] = {
            "start": row.get("start"),
            "best": row.get("best"),
            "best_global_step": row.get("best_global_step"),
            "final": row.get("final"),
            "final_minus_best": row.get("final_minus_best"),
            "drop_outside_noise": row.get("drop_outside_noise"),
        }
        for which in ("start", "best", "final"):
            ci = row.get(f"{which}_ci") or [None, None]  # [low, high]
            values[f"{which}_low"], values[f"{which}_high"] = ci[0], ci[1]
        for label, value in (row.get("after") or {}).items():
            values[f"after/{label}"] = value
        out.update(numeric(values, f"regression/{row['domain']}"))
    return out


class Tracker:
    """Fan-out to tracking backends (none: every call returns at once)."""

    def __init__(
        self,
        backends: list[Backend],
        *,
        run_dir: Path,
        name: str = "cascade",
        config: dict[str, Any] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.backends = backends
        self.run_dir = run_dir
        self.name = name
        self.config = config or {}
        self.log = log
        self.opened: list[Backend] = []
        self.step = 0
        self._failures: dict[str, int] = {}

    @classmethod
    def none(cls) -> Tracker:
        return cls([], run_dir=Path("."))

    @classmethod
    def from_config(
        cls,
        config: CascadeConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        log: Callable[[str], None] = print,
        extra: Mapping[str, Any] | None = None,
    ) -> Tracker:
        """The backends `config.tracking` lists and, on resume, those the run recorded.
        Raises `TrackingUnavailable` (one line, naming the extra) when a library is missing;
        opens nothing and writes nothing (that is `start`)."""
        names: list[str] = list(config.tracking.backends)
        if resume:
            names += [n for n in read_state(run_dir) if n not in names]
        backends = [make_backend(n, config.tracking) for n in names]
        data = config.model_dump(mode="json")
        if extra:
            data["run"] = dict(extra)
        return cls(backends, run_dir=run_dir, name=config.name, config=data, log=log)

    def __bool__(self) -> bool:
        return bool(self.backends)

    # ------------------------------------------------------------------ the run's life

    def start(self, global_step: int) -> None:
        """Open (or reopen, from `tracking.json`) every backend's run at `global_step`."""
        if not self.backends or self.opened:
            return
        self.step = global_step
        recorded = read_state(self.run_dir)
        state = dict(recorded)
        for backend in self.backends:
            previous = recorded.get(backend.name, {})
            ctx = RunContext(
                run_dir=self.run_dir,
                name=self.name,
                config=self.config,
                start_step=global_step,
                resumed=bool(previous),
                previous=previous,
            )
            try:
                state[backend.name] = backend.open(ctx)
            except Exception as err:
                self.close("failed")
                raise TrackingUnavailable(f"tracking: {backend.name} could not start: {err}") from err
            self.opened.append(backend)
            how = "continued" if previous else "started"
            where = ", ".join(f"{k} {v}" for k, v in state[backend.name].items() if v)
            self.log(f"tracking: {backend.name} run {how} ({where})")
        tmp = self.run_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.run_dir / STATE_FILE)

    def log_step(self, step: int, metrics: Mapping[str, Any], *, stage: int) -> None:
        if not self.opened:
            return
        self.step = max(self.step, step)
        values = numeric(metrics, "train")
        values["train/stage"] = float(stage)
        self._each("log_metrics", step, values)

    def log_eval(self, step: int, evals: Mapping[str, DomainEval]) -> None:
        if not self.opened:
            return
        values: dict[str, float] = {}
        for domain, result in evals.items():
            values[f"eval/{domain}/n"] = float(result.n)
            for metric, v in result.metrics.items():
                values[f"eval/{domain}/{metric}"] = v.value
                values[f"eval/{domain}/{metric}/low"] = v.low
                values[f"eval/{domain}/{metric}/high"] = v.high
        self._each("log_metrics", step, values)

    def log_checkpoint(self, step: int, path: Path) -> None:
        if self.opened:
            self._each("log_checkpoint", step, path)

    def finish(self, stopped_by: str, report_dir: Path | None) -> None:
        """The report (when one was written) and the checkpoints' paths, then close every run."""
        if not self.opened:
            return
        if report_dir is not None and report_dir.is_dir():
            self._each("log_report", self.step, report_dir, regression_summary(report_dir))
        paths = {p.name: p for p in sorted((self.run_dir / "checkpoints").glob("step-*")) if p.is_dir()}
        paths |= {f"teacher-{p.name}": p for p in sorted((self.run_dir / "teachers").glob("*")) if p.is_dir()}
        self._each("log_files", self.step, "checkpoints", paths)
        self.close("completed" if stopped_by in ("completed", "already finished") else stopped_by)

    def close(self, status: str | None = None) -> None:
        """Close every open run; without a status, from the exception in flight (none or Ctrl-C:
        `interrupted`, another: `failed`). Safe to call again."""
        if status is None:
            err = sys.exc_info()[1]
            status = "interrupted" if err is None or isinstance(err, KeyboardInterrupt) else "failed"
        opened, self.opened = self.opened, []
        for backend in opened:
            try:
                backend.close(status)
            except Exception as err:
                self.log(f"tracking: {backend.name} did not close cleanly: {err}")

    def _each(self, method: str, *args: Any) -> None:
        for backend in self.opened:
            try:
                getattr(backend, method)(*args)
            except Exception as err:
                n = self._failures[backend.name] = self._failures.get(backend.name, 0) + 1
                if n <= _QUIET_AFTER:
                    more = " (further failures counted only)" if n == _QUIET_AFTER else ""
                    self.log(f"tracking: {backend.name} {method} failed: {type(err).__name__}: {err}{more}")

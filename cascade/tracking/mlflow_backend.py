"""MLflow: one MLflow run per Cascade run, through `MlflowClient` (no global active run).

The store is `tracking.mlflow.tracking_uri`, else `MLFLOW_TRACKING_URI`, else a SQLite store in
the run directory (`<run dir>/mlflow/mlflow.db`, artifacts in `<run dir>/mlflow/artifacts`).
The resolved config goes in as params (dotted keys) and as `config.json`; step metrics and evals
as metrics at the global step (MLflow names allow no `@`: `pass@4` is logged as `pass_at_4`);
the latest checkpoint as a tag; at the end the report directory as artifacts and the regression
table's numbers as metrics. A resumed run reopens the recorded run id. MLflow keeps every value
it is given, so a step redone after a crash has two values at that step (the later one counts);
a run stopped cleanly (`--stop-after-steps`, a pause) redoes none.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.config.tracking import MlflowSettings
from cascade.tracking.base import RunContext, flatten, mask_password

DEFAULT_DIR = "mlflow"
_INVALID = re.compile(r"[^/\w.\- :]")
STATUS = {"completed": "FINISHED", "failed": "FAILED"}
"""MLflow run status per outcome; anything else (interrupted, paused, aborted) is KILLED."""


def metric_key(key: str) -> str:
    """`key` as MLflow accepts it (alphanumerics, `_ - . / : space`): `@` becomes `_at_`."""
    return _INVALID.sub("_", key.replace("@", "_at_"))


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class MlflowBackend:
    name = "mlflow"

    def __init__(self, settings: MlflowSettings) -> None:
        self.settings = settings
        self.client: Any = None
        self.run_id = ""

    def _uri(self, run_dir: Path) -> tuple[str, str | None]:
        """The tracking URI and, for the default store in the run directory, its artifact root."""
        uri = self.settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            return uri, None
        root = (run_dir / DEFAULT_DIR).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{root / 'mlflow.db'}", (root / "artifacts").as_uri()

    def open(self, ctx: RunContext) -> dict[str, Any]:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # nothing leaves the host unasked
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri, artifacts = self._uri(ctx.run_dir)
        self.client = MlflowClient(tracking_uri=uri)
        reopened = False
        same_store = ctx.previous.get("tracking_uri") == mask_password(uri)
        if ctx.resumed and ctx.previous.get("run_id") and same_store:
            try:
                self.client.get_run(ctx.previous["run_id"])
                self.run_id = ctx.previous["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                reopened = True
            except MlflowException:
                pass  # not in this store (deleted, or another store): a new run
        if not reopened:
            self.run_id = self._create_run(ctx, artifacts)
            self._log_config(ctx)
        else:
            self.client.log_dict(self.run_id, ctx.config, f"config/resumed-g{ctx.start_step:06d}.json")
        experiment_id = self.client.get_run(self.run_id).info.experiment_id
        return {"tracking_uri": mask_password(uri), "run_id": self.run_id, "experiment_id": experiment_id}

    def _create_run(self, ctx: RunContext, artifacts: str | None) -> str:
        name = self.settings.experiment or ctx.name
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            experiment_id = self.client.create_experiment(name, artifact_location=artifacts)
        else:
            experiment_id = experiment.experiment_id
        tags = {"cascade.run_dir": str(ctx.run_dir.resolve()), **self.settings.tags}
        run = self.client.create_run(
            experiment_id, run_name=self.settings.run_name or ctx.run_dir.name, tags=tags
        )
        return str(run.info.run_id)

    def _log_config(self, ctx: RunContext) -> None:
        from mlflow.entities import Param

        params = [
            Param(metric_key(k)[:250], "" if v is None else str(v)[:6000])
            for k, v in flatten(ctx.config).items()
        ]
        for chunk in _chunks(params, 100):
            self.client.log_batch(self.run_id, params=chunk)
        self.client.log_dict(self.run_id, ctx.config, "config.json")

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        entries = [Metric(metric_key(k), float(v), ts, step) for k, v in metrics.items()]
        for chunk in _chunks(entries, 1000):
            self.client.log_batch(self.run_id, metrics=chunk)

    def log_text(self, step: int, tag: str, text: str) -> None:
        self.client.log_text(self.run_id, text, f"{tag}/g{step:06d}.txt")

    def log_checkpoint(self, step: int, path: Path) -> None:
        self.client.set_tag(self.run_id, "checkpoint/latest", str(path.resolve()))
        self.client.set_tag(self.run_id, "checkpoint/latest_step", str(step))

    def log_report(self, step: int, report_dir: Path, summary: Mapping[str, float]) -> None:
        self.client.log_artifacts(self.run_id, str(report_dir), "report")
        self.log_metrics(step, summary)

    def log_files(self, step: int, name: str, paths: Mapping[str, Path]) -> None:
        listing = {key: str(p.resolve()) for key, p in paths.items()}
        self.client.log_dict(self.run_id, listing, f"{name}.json")

    def close(self, status: str) -> None:
        if self.client is not None and self.run_id:
            self.client.set_terminated(self.run_id, STATUS.get(status, "KILLED"))
            self.client = None

"""Weights & Biases: offline by default (written under the run directory, `wandb sync` uploads it),
online when `tracking.wandb.mode: online`.

The run's id is recorded in `tracking.json`; a resumed run calls `wandb.init(id=..., resume="allow")`
so W&B continues the same run (offline, each process writes its own `offline-run-*` folder of
that id; `wandb sync` joins them). The global step is W&B's step. W&B refuses a step below one
it has seen, so a step redone after a crash keeps its first value there (a run stopped cleanly
redoes none). The resolved config is the run's config; the regression table is a `wandb.Table`
and the summary; the report directory is an artifact, checkpoints' paths are a reference
artifact (paths only, nothing copied or hashed).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.config.tracking import WandbSettings
from cascade.tracking.base import RunContext

FAILED = ("failed", "aborted", "lease lost")
"""Outcomes finished with exit code 1 (W&B shows the run failed); completed, interrupted and
paused runs exit 0 (a resumed run continues it)."""


def _artifact_name(text: str) -> str:
    return re.sub(r"[^\w.-]", "-", text)


class WandbBackend:
    name = "wandb"

    def __init__(self, settings: WandbSettings) -> None:
        self.settings = settings
        self.run: Any = None

    def open(self, ctx: RunContext) -> dict[str, Any]:
        import wandb

        s = self.settings
        project = s.project or ctx.name
        run_id = None
        if ctx.resumed and ctx.previous.get("id") and ctx.previous.get("project") == project:
            run_id = str(ctx.previous["id"])
        run_id = run_id or uuid.uuid4().hex[:12]
        wandb_dir = (s.dir or ctx.run_dir).resolve()
        wandb_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            entity=s.entity,
            id=run_id,
            name=s.name or ctx.run_dir.name,
            group=s.group,
            tags=s.tags or None,
            dir=str(wandb_dir),
            mode=s.mode,
            resume="allow",
            config=ctx.config,
            allow_val_change=True,
            reinit="create_new",
            settings=wandb.Settings(console="off", save_code=False, quiet=True),
        )
        return {"id": run_id, "project": project, "entity": s.entity, "mode": s.mode, "dir": str(wandb_dir)}

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_text(self, step: int, tag: str, text: str) -> None:
        self.run.summary[tag] = text

    def log_checkpoint(self, step: int, path: Path) -> None:
        self.run.summary["checkpoint/latest"] = str(path.resolve())
        self.run.summary["checkpoint/latest_step"] = step

    def log_report(self, step: int, report_dir: Path, summary: Mapping[str, float]) -> None:
        import json

        import wandb

        for key, value in summary.items():
            self.run.summary[key] = value
        table_json = report_dir / "regression_table.json"
        logged: dict[str, Any] = {}
        if table_json.is_file():
            data = json.loads(table_json.read_text())
            columns = ["domain", "start", *data["stages"], "best", "final", "final_minus_best"]
            columns += ["final_low", "final_high", "best_low", "best_high", "drop_outside_noise"]
            rows = []
            for r in data["rows"]:
                final_ci, best_ci = r.get("final_ci") or [None, None], r.get("best_ci") or [None, None]
                rows.append(
                    [r["domain"], r["start"], *(r["after"].get(label) for label in data["stages"])]
                    + [r["best"], r["final"], r["final_minus_best"]]
                    + [final_ci[0], final_ci[1], best_ci[0], best_ci[1]]
                    + [r.get("drop_outside_noise")]
                )
            logged["report/regression_table"] = wandb.Table(columns=columns, data=rows)
        for png in sorted(report_dir.glob("*.png")):
            logged[f"report/{png.stem}"] = wandb.Image(str(png))
        if logged:
            self.run.log(logged, step=step)
        artifact = wandb.Artifact(_artifact_name(f"{self.run.name}-report"), type="report")
        artifact.add_dir(str(report_dir))
        self.run.log_artifact(artifact)

    def log_files(self, step: int, name: str, paths: Mapping[str, Path]) -> None:
        import wandb

        if not paths:
            return
        artifact = wandb.Artifact(_artifact_name(f"{self.run.name}-{name}"), type="model")
        for key, path in paths.items():
            artifact.add_reference(path.resolve().as_uri(), name=key, checksum=False)
        self.run.log_artifact(artifact)

    def close(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if status in FAILED else 0)
            self.run = None

"""TensorBoard: event files in `<run dir>/tensorboard` (or `tracking.tensorboard.log_dir`).

Scalars for every step metric and eval (with `low`/`high` of its interval), the resolved config
as text and as hparams, checkpoints' paths and the regression table as text, the report's curves
as images. A resumed run writes to the same directory with `purge_step` at its first new step,
so the steps it redoes after the checkpoint replace the first attempt's in TensorBoard.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.config.tracking import TensorBoardSettings
from cascade.tracking.base import RunContext, flatten

DEFAULT_DIR = "tensorboard"


def _hparam_value(value: Any) -> bool | int | float | str:
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value)


class TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, settings: TensorBoardSettings) -> None:
        self.settings = settings
        self.writer: Any = None

    def open(self, ctx: RunContext) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.settings.log_dir or ctx.run_dir / DEFAULT_DIR
        if ctx.resumed and ctx.previous.get("log_dir"):
            log_dir = Path(ctx.previous["log_dir"])
        purge = ctx.start_step + 1 if ctx.start_step > 0 else None
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge, flush_secs=30)
        if not ctx.resumed:
            self._log_config(ctx)
        return {"log_dir": str(Path(log_dir).resolve())}

    def _log_config(self, ctx: RunContext) -> None:
        from torch.utils.tensorboard.summary import hparams

        text = json.dumps(ctx.config, indent=1, default=str)
        self.writer.add_text("config", f"```json\n{text}\n```", ctx.start_step)
        flat = {k: _hparam_value(v) for k, v in flatten(ctx.config).items()}
        for summary in hparams(flat, {}):
            self.writer.file_writer.add_summary(summary)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_text(self, step: int, tag: str, text: str) -> None:
        self.writer.add_text(tag, text, step)

    def log_checkpoint(self, step: int, path: Path) -> None:
        self.writer.add_text("checkpoint", str(path.resolve()), step)

    def log_report(self, step: int, report_dir: Path, summary: Mapping[str, float]) -> None:
        md = report_dir / "regression_table.md"
        if md.is_file():
            self.writer.add_text("report/regression_table", md.read_text(), step)
        self.log_metrics(step, summary)
        import matplotlib.image as mpimg

        for png in sorted(report_dir.glob("*.png")):
            self.writer.add_image(f"report/{png.stem}", mpimg.imread(png), step, dataformats="HWC")

    def log_files(self, step: int, name: str, paths: Mapping[str, Path]) -> None:
        lines = "\n".join(f"- `{key}`: `{p.resolve()}`" for key, p in paths.items())
        self.writer.add_text(name, lines or "(none)", step)

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None

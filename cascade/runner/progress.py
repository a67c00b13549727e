"""Rich progress bars for a run; a disabled instance does nothing (no `if progress:` checks)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RunProgress:
    def __init__(self, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: Any = None
        self._eval = ""

    def start_stage(self, index: int, label: str, total: int, done: int) -> None:
        if not self.enabled:
            return
        self.stop()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            f"stage {index + 1} {label}", total=total, completed=done, info=""
        )

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if self._progress is None:
            return
        info = f"reward {metrics.get('reward_mean', 0.0):.2f}"
        if "loss_distill" in metrics:
            info += f"  distill {metrics['loss_distill']:.3f}"
        if self._eval:
            info += f"  | eval {self._eval}"
        self._progress.update(self._task, completed=step, info=info)

    def set_eval(self, scores: dict[str, float]) -> None:
        self._eval = " ".join(f"{k} {v:.0%}" for k, v in scores.items())

    def end_stage(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def log(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            self.console.print(message)

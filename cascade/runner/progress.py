"""What a run shows while it trains: progress bars on a terminal, one log line per step elsewhere
(output piped to `tee`, `nohup`, CI, or `--no-progress`). A disabled instance shows nothing (no
`if progress:` checks in the loop)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# (metric, label, format) of a step line, in order; a metric the step did not report is left out
_LINE_FIELDS = (
    ("reward_mean", "reward", "{:.3f}"),
    ("kl", "kl", "{:.4f}"),
    ("loss_distill", "distill", "{:.4f}"),
    ("lambda", "lambda", "{:.2f}"),
    ("completion_tokens_mean", "len", "{:.0f}"),
    ("clip_fraction", "clip", "{:.3f}"),
    ("entropy", "entropy", "{:.3f}"),
    ("time_step_s", "s/step", "{:.2f}"),
)


def step_line(stage: str, step: int, total: int, metrics: dict[str, Any], evals: str = "") -> str:
    """One step's log line: `stage math step 3/30  reward 0.412  kl 0.0012 ...  | eval ...`."""
    parts = [f"stage {stage} step {step}/{total}"]
    for key, label, fmt in _LINE_FIELDS:
        value = metrics.get(key)
        if isinstance(value, int | float):
            parts.append(f"{label} {fmt.format(value)}")
    line = "  ".join(parts)
    return f"{line}  | eval {evals}" if evals else line


class RunProgress:
    """`enabled`: show anything at all; `bars`: progress bars when the console is a terminal
    (otherwise, and with `bars=False`, a log line per step)."""

    def __init__(self, enabled: bool = True, console: Console | None = None, bars: bool = True) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.bars = enabled and bars and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._eval = ""
        self._stage = ""
        self._total = 0

    def start_stage(self, index: int, label: str, total: int, done: int) -> None:
        if not self.enabled:
            return
        self.stop()
        self._stage, self._total = label, total
        if not self.bars:
            return
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
            f"stage {index + 1} {escape(label)}", total=total, completed=done, info=""
        )

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            line = step_line(self._stage, step, self._total, metrics, self._eval)
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        info = f"reward {metrics.get('reward_mean', 0.0):.2f}"
        if "loss_distill" in metrics:
            info += f"  distill {metrics['loss_distill']:.3f}"
        if self._eval:
            info += f"  | eval {self._eval}"
        self._progress.update(self._task, completed=step, info=escape(info))

    def set_eval(self, scores: dict[str, float]) -> None:
        self._eval = " ".join(f"{k} {v:.0%}" for k, v in scores.items())

    def end_stage(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def log(self, message: str) -> None:
        """A plain line (never read as rich markup: `[low-high]` and paths print as written)."""
        console = self._progress.console if self._progress is not None else self.console
        console.print(message, markup=False, highlight=False, soft_wrap=True)

"""`--fresh` deletes a run's checkpoints, teachers and history: on a run that has any, it asks
first in a terminal, and elsewhere (CI, a pod, `cascade up`'s child processes) needs `--yes`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def has_history(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(run_dir.iterdir())


def confirm_fresh(
    run_dir: Path, *, yes: bool, ask: Callable[[str], str] = input, interactive: bool | None = None
) -> str | None:
    """None when `--fresh` may go ahead; else why not (one line)."""
    if yes or not has_history(run_dir):
        return None
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        return f"--fresh would delete the run in {run_dir}: add --yes to confirm (no terminal to ask)"
    answer = ask(f"--fresh deletes the run in {run_dir} (checkpoints, teachers, history). Type 'yes': ")
    if answer.strip().lower() != "yes":
        return "not confirmed: nothing deleted"
    return None

"""What every tracking backend implements, and the helpers they share.

A backend is opened once per process (`open`), given flat numeric metrics keyed by name and the
global step (the x-axis of every backend: a resumed run redoes the steps after its checkpoint
under the same step numbers), texts, checkpoint paths and the finished report, and closed with
the run's outcome. Its third-party library is imported only in `open`; `require` checks that it
is installed without importing it, so a missing extra is an error at start, in one line.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

EXTRA_HINT = "pip install 'cascade-rl[tracking]'"

MODULES: dict[str, str] = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""The module each backend imports (all three come with the `tracking` extra)."""


class TrackingUnavailable(Exception):
    """A configured tracking backend's library is not installed, or its run cannot be opened:
    the run cannot start as configured (the CLIs print it as one line, like a run-dir error)."""


def require(backend: str) -> None:
    """Raise `TrackingUnavailable` naming the extra when `backend`'s library is not installed."""
    module = MODULES[backend]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TrackingUnavailable(
            f"tracking.backends: {backend} needs the {module!r} package, which is not installed: {EXTRA_HINT}"
        )


@dataclass
class RunContext:
    """What a backend needs to open its run: where the run lives and what it is."""

    run_dir: Path
    name: str
    """The cascade's `name` (default experiment / project)."""
    config: dict[str, Any]
    """The resolved config (JSON-safe), plus how the run was started (`distill`, `mode`)."""
    start_step: int = 0
    """The global step the run starts or resumes at."""
    resumed: bool = False
    """The backend reopens a run it recorded in `tracking.json`."""
    previous: dict[str, Any] = field(default_factory=dict)
    """What the backend recorded at its last open (empty on a new run)."""


class Backend(Protocol):
    name: str

    def open(self, ctx: RunContext) -> dict[str, Any]:
        """Start or reopen the tracked run; returns what `tracking.json` keeps to reopen it."""
        ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_text(self, step: int, tag: str, text: str) -> None: ...

    def log_checkpoint(self, step: int, path: Path) -> None: ...

    def log_report(self, step: int, report_dir: Path, summary: Mapping[str, float]) -> None:
        """The finished run's report directory (regression table, metrics.json, curves) and the
        regression table's numbers, flat."""
        ...

    def log_files(self, step: int, name: str, paths: Mapping[str, Path]) -> None:
        """Paths (checkpoints, teachers) recorded by reference: never copied."""
        ...

    def close(self, status: str) -> None:
        """End the run: `completed`, `failed`, or `interrupted` (to be resumed)."""
        ...


def flatten(value: Any, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Nested dicts and lists as one level, keys joined with `sep` (lists by index)."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{sep}{k}" if prefix else str(k), sep))
    elif isinstance(value, list | tuple) and value:
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}{sep}{i}" if prefix else str(i), sep))
    else:
        out[prefix] = value
    return out


def numeric(metrics: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The numbers in a (nested) metrics dict, as `prefix/key[/subkey]`: floats, ints and bools;
    strings, None and empty containers are left out."""
    out: dict[str, float] = {}
    for key, value in flatten(metrics, sep="/").items():
        if isinstance(value, bool | int | float) and key:
            out[f"{prefix}/{key}"] = float(value)
    return out


_URL_PASSWORD = re.compile(r"(//[^/:@]*:)[^@/]*@")


def mask_password(uri: str) -> str:
    """A URI as it may be written to disk: `scheme://user:***@host` (no secrets in the run dir)."""
    return _URL_PASSWORD.sub(r"\1***@", uri)

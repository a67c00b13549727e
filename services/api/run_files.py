"""Files the API reads from a run's directory: the latest completions (`completions.jsonl`).

A run's directory is its `output_dir` as the runner stored it (a relative one taken from the
settings' `base_dir`, symlinks followed). The API reads it only inside the settings' `runs_root`
(the same confinement as a created cascade's `output_dir`, `services.api.paths`): a run started
elsewhere by the CLI, or a log that is a symlink out of the root, is not read, and the answer
says why. A missing, unreadable or half-written file is an empty list with a note, never an
error; only the file's tail is read (`TAIL_BYTES` at most), however long the run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from cascade.config import resolve_path
from services.api import schemas
from services.api.paths import PathRoots

COMPLETIONS_LOG = "completions.jsonl"
"""`cascade.runner.step_logs.COMPLETIONS_LOG` (not imported: that module needs the trainer)."""
TAIL_BYTES = 8 * 1024 * 1024
"""The most of a log read per request (a record is ~5 kB of text; its JSON at most ~6x that)."""
_CHUNK = 256 * 1024


def run_dir(output_dir: str, roots: PathRoots) -> tuple[Path | None, str | None]:
    """The run directory, or None and why it is not read."""
    try:
        path = resolve_path(output_dir, roots.base)
    except ValueError as err:
        return None, f"the run's directory is not a usable path ({err})"
    if not path.is_relative_to(roots.runs):
        return None, (
            f"the run's directory {path} is outside the API's runs root {roots.runs} (paths.runs_root): "
            "its files are not served"
        )
    return path, None


def tail_lines(path: Path, count: int, limit: int = TAIL_BYTES) -> list[bytes]:
    """The last `count` complete lines of `path`, reading back from its end no more than `limit`
    bytes (a line cut by that limit, or by a writer mid-append, is left out)."""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        pos = end
        data = b""
        while pos > 0 and data.count(b"\n") <= count and end - pos < limit:
            step = min(_CHUNK, pos, limit - (end - pos))
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.split(b"\n")
    if not data.endswith(b"\n"):
        lines.pop()  # the last line is still being written
    else:
        lines.pop()  # the empty text after the final newline
    if pos > 0 and lines:
        lines.pop(0)  # starts mid-line
    return [line for line in lines if line.strip()][-count:]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def completion_out(record: dict[str, Any]) -> schemas.CompletionOut:
    """One `completions.jsonl` record as served: missing or mistyped fields are None (or empty
    text), a non-finite reward None (JSON has no NaN)."""
    return schemas.CompletionOut(
        global_step=_integer(record.get("global_step")),
        stage=_text(record.get("stage")),
        domain=_text(record.get("domain")),
        problem=_text(record.get("problem")),
        prompt=_text(record.get("prompt")) or "",
        completion=_text(record.get("completion")) or "",
        reward=_number(record.get("reward")),
        reason=_text(record.get("reason")),
        detail=_text(record.get("detail")),
        finish=_text(record.get("finish")),
        tokens=_integer(record.get("tokens")),
    )


def latest_completions(
    output_dir: str, roots: PathRoots, last: int
) -> tuple[list[schemas.CompletionOut], str | None]:
    """The run's last `last` completions, oldest first, and a note when there are none to show."""
    directory, why = run_dir(output_dir, roots)
    if directory is None:
        return [], why
    try:
        path = Path(os.path.realpath(directory / COMPLETIONS_LOG))
    except (ValueError, OSError) as err:
        return [], f"cannot read {COMPLETIONS_LOG} ({err})"
    if not path.is_relative_to(roots.runs):
        return [], f"{directory / COMPLETIONS_LOG} leads outside the API's runs root: not served"
    if not path.is_file():
        return [], f"no completions logged yet ({directory / COMPLETIONS_LOG} does not exist)"
    try:
        lines = tail_lines(path, last)
    except OSError as err:
        return [], f"cannot read {path}: {err.strerror or err}"
    out = []
    for line in lines:
        try:
            record = json.loads(line.decode("utf-8", errors="replace"))
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(completion_out(record))
    return out, None if out else f"no readable record in {path}"

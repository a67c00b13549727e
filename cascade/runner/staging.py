"""Files a fenced write puts in place: a checkpoint or a teacher is written under a name stamped
with the writer's lease epoch, and renamed to its real name only by the transaction that records
it, after the lease check (`RunStore.record_checkpoint(publish=...)`). A runner taken over
mid-write leaves at most a staging directory, which nothing reads as a checkpoint, and two
runners writing the same step never write into the same directory."""

from __future__ import annotations

import shutil
from pathlib import Path

STAGED_SUFFIX = ".staged"


def staged_path(final: Path, epoch: int) -> Path:
    return final.with_name(f"{final.name}.e{epoch}{STAGED_SUFFIX}")


def publish(staged: Path, final: Path) -> None:
    """Rename `staged` to `final` (replacing it). Idempotent: done again after a commit whose
    reply was lost, `staged` is gone and `final` is there, and nothing happens."""
    if not staged.exists():
        if final.exists():
            return
        raise FileNotFoundError(f"{staged}: the staged write to publish as {final.name} is missing")
    if final.exists():
        shutil.rmtree(final)
    staged.rename(final)


def clear_stale(root: Path) -> list[Path]:
    """Remove staging directories left under `root` by writers that stopped (or were taken over)
    before publishing; returns what it removed."""
    if not root.exists():
        return []
    gone = sorted(p for p in root.iterdir() if p.name.endswith(STAGED_SUFFIX))
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone

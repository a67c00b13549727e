"""Model files readable by whoever may read the directory they were written to.

safetensors writes its file with mode 0600 whatever the umask, so a model directory saved by one
user (the host's, `cascade model init`, a checkpoint) cannot be loaded by another (a container's
service user, uid 10001). After a save, each file gets the mode a plain `open()` would have given
it under the process's umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_umask_allows(directory: Path) -> None:
    """Give every regular file under `directory` the mode `0o666 & ~umask` (at least 0600)."""
    mode = (0o666 & ~_umask()) | 0o600
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            if stat.S_IMODE(path.stat().st_mode) != mode:
                path.chmod(mode)

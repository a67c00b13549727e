"""Busy-looping processes on the CPU, for drills of what must not depend on thread timing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cores_loaded(processes: int = 2) -> Iterator[None]:
    """`processes` processes spinning for the block's duration (this machine has two cores)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()

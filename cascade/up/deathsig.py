"""Every process `cascade up` starts dies with it, even when `cascade up` is SIGKILLed.

On Linux each child is started through this file run as a script (`wrap()`): it asks the kernel
for SIGTERM when its parent dies (`prctl(PR_SET_PDEATHSIG)`), which survives the `exec` of the
real command that follows, so the service, Celery worker or learner gets SIGTERM and stops as on
Ctrl-C (torchrun and Celery pass it on to their own processes). Done in the child and not in a
`preexec_fn` (unsafe in a parent with threads: gRPC's), it costs one small interpreter start
(`-I -S`: the standard library only, nothing of `cascade` imported) before the `exec`.

The race where the parent dies between the fork and the `prctl` is closed by comparing
`os.getppid()` afterwards with the parent's pid given on the command line: the child then exits
without starting anything. The kernel sends the signal when the *thread* that forked the child
ends: `cascade up` starts (and restarts) its processes from its main thread only.

Elsewhere (macOS) `wrap()` leaves the command as it is; `cascade up --resume` still finds what
survived (`cascade.up.orphans`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
EXIT_PARENT_GONE = 143
"""The child's exit code when its parent died before it could start (as if SIGTERMed)."""


def supported() -> bool:
    return sys.platform.startswith("linux")


def wrap(argv: Sequence[str], parent: int | None = None) -> list[str]:
    """`argv` run so that it gets SIGTERM when `parent` (default: this process) dies."""
    if not supported():
        return list(argv)
    parent = os.getpid() if parent is None else parent
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(parent), "--", *argv]


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")


def parent_death_signal() -> int:
    """This process's parent-death signal (0: none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    sig = ctypes.c_int(0)
    if libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_GET_PDEATHSIG): {os.strerror(errno)}")
    return sig.value


def main(args: Sequence[str]) -> int:
    """`PARENT_PID -- ARGV...`: the death signal set, then `exec ARGV` (returns only on failure)."""
    if len(args) < 3 or args[1] != "--":
        print("usage: deathsig.py PARENT_PID -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    parent, argv = int(args[0]), list(args[2:])
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # it died before the prctl: nobody would stop this process
        print(
            f"cascade up (pid {parent}) ended before {argv[0]} could start: not started",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PARENT_GONE
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        print(f"cascade up: cannot start {argv[0]}: {err}", file=sys.stderr, flush=True)
        return 127
    return 127  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

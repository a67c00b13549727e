"""What `cascade up` started, written down so that a later `cascade up` finds what outlived it.

Each start (and restart) of a process writes `up-processes.json` in the stack's log directory:
the `cascade up` process itself and, per process name, its pid with its start time (field 22 of
`/proc/<pid>/stat`, so a pid the kernel reused for something else is never taken for it), the
host and the boot. Each process leads its own process group, so what it started (Celery's pool,
torchrun's ranks) is found by its group id even once the leader is gone. A clean stop marks the
file stopped.

Before it starts anything, `cascade up` (`--resume`, `--fresh` or not) reads that file from the
log directory it will use, the default one next to the run directory and the one the run's
`run.json` recorded, and refuses to start while a process it lists still runs: the `cascade up`
that wrote it (stop that one first), or orphans whose `cascade up` is gone (SIGKILLed before
processes died with their parent, older code, a process that ignored the signal). The refusal
names each by name and pid and gives the `kill` command that stops their process groups. It does
not stop them itself: an orphan learner may be in the middle of a step the operator wants to see
end, or its log to read first, and a process named only by a file is not killed without a person
deciding (see docs/operations.md).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "up-processes.json"
_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    state: str
    ppid: int
    pgrp: int
    start: int
    """Start time in clock ticks after boot."""

    @property
    def running(self) -> bool:
        """Neither a zombie nor dead (a zombie is gone, only not yet reaped)."""
        return self.state not in ("Z", "X", "x")


def proc_stat(pid: int) -> ProcStat | None:
    """Fields of `/proc/<pid>/stat`, or None when there is no such process (or no /proc)."""
    try:
        data = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    rest = data[data.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return ProcStat(state=rest[0], ppid=int(rest[1]), pgrp=int(rest[2]), start=int(rest[19]))


def start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return None if stat is None else stat.start


def boot_id() -> str:
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def running(pid: int, start: int | None) -> bool:
    """Whether `pid` is the process that started at `start` and has not ended."""
    stat = proc_stat(pid)
    return stat is not None and stat.running and stat.start == start


def _group_members(pgid: int, since: int) -> list[int]:
    """Live processes of process group `pgid` started at or after `since` (ticks)."""
    members = []
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        if stat is not None and stat.pgrp == pgid and stat.running and stat.start >= since:
            members.append(int(entry.name))
    return sorted(members)


class StackRecord:
    """`up-processes.json` of one `cascade up` (`LocalStack` writes it as processes start)."""

    def __init__(self, log_dir: Path, run_dir: Path) -> None:
        self.path = log_dir / STATE_FILE
        pid = os.getpid()
        self.data: dict[str, Any] = {
            "up": {"pid": pid, "start": start_time(pid)},
            "host": socket.gethostname(),
            "boot_id": boot_id(),
            "run_dir": str(run_dir),
            "stopped": False,
            "processes": {},
        }

    def started(self, name: str, pid: int) -> None:
        self.data["processes"][name] = {"pid": pid, "start": start_time(pid)}
        self.data["stopped"] = False
        self._write()

    def stopped(self) -> None:
        """Every process was stopped (and waited for): nothing of this stack is left to find."""
        self.data["stopped"] = True
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.data, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)


@dataclass(frozen=True)
class Orphan:
    name: str
    pid: int
    """The process `cascade up` started (its process group's id)."""
    group: tuple[int, ...]
    """Its group's live processes (itself included when alive)."""

    def describe(self) -> str:
        others = [p for p in self.group if p != self.pid]
        if self.pid not in self.group:
            return f"{self.name} (pid {self.pid} gone, its group's {', '.join(map(str, others))} not)"
        more = f" and {len(others)} more in its process group" if others else ""
        return f"{self.name} (pid {self.pid}{more})"


@dataclass(frozen=True)
class Survivors:
    path: Path
    up_pid: int
    up_alive: bool
    """The `cascade up` that wrote the file still runs."""
    orphans: list[Orphan]

    def message(self) -> str:
        """Why no stack may start (one line)."""
        if self.up_alive:
            return (
                f"cascade up (pid {self.up_pid}) still runs the stack recorded in {self.path}: "
                f"stop it first (kill -TERM {self.up_pid}: it stops what it started)"
            )
        groups = " ".join(f"-{o.pid}" for o in self.orphans)
        learner = any(o.name == "learner" for o in self.orphans)
        why = "it would train beside the orphan learner" if learner else "they would run beside it"
        return (
            f"processes of an earlier cascade up (pid {self.up_pid}, gone) still run: "
            f"{', '.join(o.describe() for o in self.orphans)} (recorded in {self.path}); a new stack "
            f"must not start while they run ({why}): stop them with `kill -TERM -- {groups}` "
            "(their process groups; -KILL if they linger), then start again"
        )


def survivors(path: Path) -> Survivors | None:
    """What of the stack recorded at `path` still runs on this host (None: nothing, or the file
    is unreadable, from another host, or from before a reboot)."""
    try:
        data = json.loads(path.read_text())
        up = data["up"]
        procs = data["processes"]
        if data.get("stopped") or data.get("host") != socket.gethostname():
            return None  # a clean stop; another host's pids mean nothing here
        if data.get("boot_id") != boot_id():
            return None  # rebooted since: none of them survived
        up_pid, up_start = int(up["pid"]), up.get("start")
        entries = [(str(name), int(p["pid"]), p.get("start")) for name, p in procs.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if running(up_pid, up_start):
        return Survivors(path, up_pid, True, [])
    orphans = []
    for name, pid, start in entries:
        if start is None:
            continue
        leader = proc_stat(pid)
        if leader is not None and leader.start != start:
            continue  # the pid was reused: its group (if any) is someone else's
        group = set(_group_members(pid, since=int(start)))
        if leader is not None and leader.running:
            group.add(pid)  # itself, even where it left its group
        if group:
            orphans.append(Orphan(name, pid, tuple(sorted(group))))
    return Survivors(path, up_pid, False, orphans) if orphans else None


def record_paths(run_dir: Path, log_dir: Path) -> list[Path]:
    """Where earlier `cascade up`s of this run recorded their processes: the log directory given,
    the default one (`<run_dir>-logs`) and the one the run's `run.json` names."""
    from cascade.runner.record import read_record

    dirs = [log_dir, Path(f"{run_dir}-logs")]
    try:
        record = read_record(run_dir)
    except (OSError, ValueError, TypeError):
        record = None
    if record is not None and record.launch.get("log_dir"):
        dirs.append(Path(str(record.launch["log_dir"])))
    paths: list[Path] = []
    for d in dirs:
        path = d.resolve() / STATE_FILE
        if path not in paths:
            paths.append(path)
    return paths


def orphan_refusal(paths: Iterable[Path], settle_s: float = 1.0) -> str | None:
    """Why `cascade up` must not start (one line: what still runs, how to stop it), or None.
    What is found is looked at again after `settle_s` (a process SIGKILLed a moment ago by a
    stopping stack is not reported)."""
    paths = list(paths)
    found = [s for s in map(survivors, paths) if s is not None]
    if found and settle_s > 0:
        time.sleep(settle_s)
        found = [s for s in map(survivors, paths) if s is not None]
    if not found:
        return None
    return "; ".join(s.message() for s in found)

"""Memory and process caps for one sandbox worker's whole process tree (cgroup v1 or v2).

RLIMIT_AS bounds one process; a program that forks ten children could use ten times that.
A memory cgroup bounds all of a worker's processes together (the worker runs one execution at
a time, so the cap is per execution plus the worker's own few MB), and a pids cgroup caps the
process count whatever uid the processes run as. The OOM-kill counter tells a memory kill from
any other SIGKILL. Needs write access to the cgroup tree (root, or a delegated subtree);
`available()` says whether it has it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
WORKER_OVERHEAD_MB = 48
"""What the worker and judge processes themselves use, added to the program's memory cap."""
EXEC = "exec"
"""Name of the executions' child group (cgroup v1)."""
EXEC_OVERHEAD_MB = 16
"""What an execution's A and B use beside the program, within the execution's own memory cap."""
WORKER_OVERHEAD_PIDS = 8
"""bwrap, its init, the worker, its zygote, the execution's A and B, and a spare."""


def _v2_root() -> Path | None:
    if (ROOT / "cgroup.controllers").exists():
        return ROOT
    return None


def _parent_dirs() -> tuple[Path, Path] | None:
    """(memory dir, pids dir) under which worker groups are made, or None without write access."""
    v2 = _v2_root()
    if v2 is not None:
        own = Path(_own_v2_path())
        base = v2 / own.relative_to("/") if own != Path("/") else v2
        controllers = (base / "cgroup.subtree_control").read_text().split() if base.exists() else []
        if {"memory", "pids"} <= set(controllers) and os.access(base, os.W_OK):
            return base, base
        return None
    memory, pids = ROOT / "memory", ROOT / "pids"
    if (memory / "tasks").exists() and (pids / "tasks").exists():
        if os.access(memory, os.W_OK) and os.access(pids, os.W_OK):
            return memory, pids
    return None


def _own_v2_path() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


def available() -> bool:
    with contextlib.suppress(OSError, ValueError):
        return _parent_dirs() is not None
    return False


@dataclass
class WorkerGroup:
    """The cgroup(s) of one sandbox worker; processes join with `join(pid)` (from a preexec_fn)."""

    memory_dir: Path
    pids_dir: Path
    v2: bool

    @classmethod
    def create(cls, name: str, owner_uid: int | None = None) -> WorkerGroup:
        """The worker's group and, on cgroup v1, its `exec` child that each execution joins
        (its cgroup.procs handed to `owner_uid`, the sandbox uid)."""
        dirs = _parent_dirs()
        if dirs is None:
            raise OSError("no writable memory and pids cgroups")
        memory_dir, pids_dir = dirs[0] / name, dirs[1] / name
        memory_dir.mkdir(exist_ok=True)
        pids_dir.mkdir(exist_ok=True)
        group = cls(memory_dir, pids_dir, _v2_root() is not None)
        if not group.v2:
            with contextlib.suppress(OSError):  # no swap accounting on some hosts
                (memory_dir / "memory.swappiness").write_text("0")
            for directory in group.exec_dirs():
                directory.mkdir(exist_ok=True)
                if owner_uid is not None and os.geteuid() == 0:
                    os.chown(directory / "cgroup.procs", owner_uid, -1)
        return group

    def exec_dirs(self) -> list[Path]:
        """The executions' own (memory, pids) groups inside the worker's: an execution at its
        memory cap is OOM-killed inside its group, whatever it does to its oom_score_adj, and
        never takes the worker with it. cgroup v1 only (v2 forbids processes beside children)."""
        return [] if self.v2 else [self.memory_dir / EXEC, self.pids_dir / EXEC]

    def set_limits(self, memory_mb: int, processes: int) -> None:
        memory = (memory_mb + WORKER_OVERHEAD_MB) << 20
        pids = processes + WORKER_OVERHEAD_PIDS
        if self.v2:
            (self.memory_dir / "memory.max").write_text(str(memory))
            (self.memory_dir / "memory.swap.max").write_text("0")
            (self.pids_dir / "pids.max").write_text(str(pids))
        else:
            (self.memory_dir / "memory.limit_in_bytes").write_text(str(memory))
            (self.pids_dir / "pids.max").write_text(str(pids))
            exec_memory, exec_pids = self.exec_dirs()
            (exec_memory / "memory.limit_in_bytes").write_text(str((memory_mb + EXEC_OVERHEAD_MB) << 20))
            with contextlib.suppress(OSError):
                (exec_memory / "memory.swappiness").write_text("0")
            (exec_pids / "pids.max").write_text(str(processes + 2))  # + A and B

    def join(self, pid: int = 0) -> None:
        """Move `pid` (0: the caller) into the group; called in the worker's preexec_fn."""
        pid = pid or os.getpid()
        for directory in {self.memory_dir, self.pids_dir}:
            (directory / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """How many processes the kernel killed for this group's memory caps so far."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        kills = 0
        for directory in [self.memory_dir, *self.exec_dirs()[:1]]:
            with contextlib.suppress(OSError, ValueError):
                for line in (directory / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        kills += int(value)
        return kills

    def pids(self) -> list[int]:
        found: list[int] = []
        for directory in [self.pids_dir, *self.exec_dirs()[1:]]:
            with contextlib.suppress(OSError):
                found += [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        return found

    def kill_all(self, wait_s: float = 2.0) -> None:
        """SIGKILL every process in the group until it is empty (a forking process may add some)."""
        deadline = time.monotonic() + wait_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for directory in [*self.exec_dirs(), self.memory_dir, self.pids_dir]:
            with contextlib.suppress(OSError):
                directory.rmdir()


def remove_stale(prefix: str) -> int:
    """Remove groups named `<prefix>-<pid>-...` whose creating process is gone (it was killed)."""
    dirs = _parent_dirs()
    removed = 0
    if dirs is None:
        return 0
    for parent in set(dirs):
        for group in parent.glob(f"{prefix}-*"):
            owner = group.name.removeprefix(f"{prefix}-").split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                stale = WorkerGroup(group, group, _v2_root() is not None)
                stale.kill_all()
                with contextlib.suppress(OSError):
                    if (group / EXEC).is_dir():
                        (group / EXEC).rmdir()
                    group.rmdir()
                    removed += 1
    return removed

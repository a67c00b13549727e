"""Memory, process and CPU caps for one sandbox worker's whole process tree (cgroup v1 or v2).

RLIMIT_AS bounds one process; a program that forks ten children could use ten times that.
A memory cgroup bounds all of a worker's processes together (the worker runs one execution at
a time, so the cap is per execution plus the worker's own few MB), and a pids cgroup caps the
process count whatever uid the processes run as. The OOM-kill counter tells a memory kill from
any other SIGKILL. Needs write access to the cgroup tree (root, or a delegated subtree);
`available()` says whether it has it.

A CPU quota (`cpu.max` on v2, `cpu.cfs_quota_us` on v1) bounds each worker to `cpus` CPUs'
worth of time, however many threads, processes or sessions its program starts: without it,
a program whose children spin takes the cores from the execution running on the other worker,
and a correct program there times out (one completion costing another its reward). At the
root of the cpu hierarchy the kernel's autogroups make each new session a scheduling group of
its own, so a dozen children in new sessions outweighed the neighbour twelve to one; inside a
worker's group there are no autogroups, and CFS schedules the group as one entity, so the
neighbour keeps its own share.
`cpu_available()` says whether the bound can be enforced here; the preflight says so loudly
when it cannot.
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
CPU_PERIOD_US = 100_000
"""The CFS period of the CPU quota (the kernel's default): a worker over its quota waits at most
this long for the next period."""


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


def _cpu_parent(enable: bool = False) -> Path | None:
    """The directory under which worker CPU groups are made, or None where the CPU bound cannot
    be enforced. On v2 it is the memory and pids parent, with `cpu` in its subtree_control
    (`enable` adds it when missing, which root may); on v1 the cpu hierarchy's root."""
    dirs = _parent_dirs()
    if dirs is None:
        return None
    if _v2_root() is not None:
        control = dirs[0] / "cgroup.subtree_control"
        if "cpu" not in control.read_text().split() and enable:
            with contextlib.suppress(OSError):
                control.write_text("+cpu")
        return dirs[0] if "cpu" in control.read_text().split() else None
    cpu = ROOT / "cpu"
    if (cpu / "cpu.cfs_quota_us").exists() and os.access(cpu, os.W_OK):
        return cpu
    return None


def cpu_available() -> bool:
    """Whether each worker's CPU can be bounded here (a writable cpu controller)."""
    with contextlib.suppress(OSError, ValueError):
        if _cpu_parent() is not None:
            return True
        v2 = _v2_root()
        dirs = _parent_dirs()
        if v2 is not None and dirs is not None:  # not enabled yet, but root may enable it
            return "cpu" in (dirs[0] / "cgroup.controllers").read_text().split()
    return False


@dataclass
class WorkerGroup:
    """The cgroup(s) of one sandbox worker; processes join with `join(pid)` (from a preexec_fn)."""

    memory_dir: Path
    pids_dir: Path
    v2: bool
    cpu_dir: Path | None = None
    """The worker's CPU group (the memory one on v2); None where the host cannot bound CPU."""

    @classmethod
    def create(cls, name: str, owner_uid: int | None = None, cpus: float | None = 1.0) -> WorkerGroup:
        """The worker's group and, on cgroup v1, its `exec` child that each execution joins
        (its cgroup.procs handed to `owner_uid`, the sandbox uid). `cpus`: the worker's CPU
        quota in CPUs (None: no CPU group), applied where the host allows."""
        dirs = _parent_dirs()
        if dirs is None:
            raise OSError("no writable memory and pids cgroups")
        memory_dir, pids_dir = dirs[0] / name, dirs[1] / name
        memory_dir.mkdir(exist_ok=True)
        pids_dir.mkdir(exist_ok=True)
        group = cls(memory_dir, pids_dir, _v2_root() is not None)
        cpu_parent = _cpu_parent(enable=True) if cpus is not None else None
        if cpus is not None and cpu_parent is not None:
            group.cpu_dir = cpu_parent / name
            group.cpu_dir.mkdir(exist_ok=True)
            group.set_cpus(cpus)
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

    def set_cpus(self, cpus: float) -> None:
        """At most `cpus` CPUs' worth of time per CFS period for the whole worker."""
        if self.cpu_dir is None:
            raise OSError("this worker has no CPU group")
        quota = max(1000, round(cpus * CPU_PERIOD_US))
        if self.v2:
            (self.cpu_dir / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (self.cpu_dir / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (self.cpu_dir / "cpu.cfs_quota_us").write_text(str(quota))

    def cpu_limit(self) -> float | None:
        """The CPU quota in force, in CPUs (None: unbounded or no CPU group)."""
        if self.cpu_dir is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            if self.v2:
                quota, period = (self.cpu_dir / "cpu.max").read_text().split()
            else:
                quota = (self.cpu_dir / "cpu.cfs_quota_us").read_text().strip()
                period = (self.cpu_dir / "cpu.cfs_period_us").read_text().strip()
            if quota not in ("max", "-1"):
                return int(quota) / int(period)
        return None

    def dirs(self) -> list[Path]:
        """Every group directory of the worker (the worker's processes join each)."""
        return sorted({self.memory_dir, self.pids_dir, *([self.cpu_dir] if self.cpu_dir else [])})

    def join(self, pid: int = 0) -> None:
        """Move `pid` (0: the caller) into the group; called in the worker's preexec_fn."""
        pid = pid or os.getpid()
        for directory in self.dirs():
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
        for directory in [*self.exec_dirs(), *self.dirs()]:
            with contextlib.suppress(OSError):
                directory.rmdir()


def remove_stale(prefix: str) -> int:
    """Remove groups named `<prefix>-<pid>-...` whose creating process is gone (it was killed)."""
    dirs = _parent_dirs()
    removed = 0
    if dirs is None:
        return 0
    cpu = _cpu_parent()
    for parent in {*dirs, *([cpu] if cpu is not None else [])}:
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

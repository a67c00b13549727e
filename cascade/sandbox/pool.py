"""Warm bubblewrap workers, one per core, each running one execution at a time.

A worker is `bwrap` (every namespace unshared, no network, read-only /usr and root, private
tmpfs /tmp, minimal /dev, new /proc, empty environment, dies with its parent) started as a
dedicated non-root uid — bwrap started as real root leaves the program root's powers — in
its own memory, pids and CPU cgroups where the host allows (the CPU quota, one CPU per worker
by default, keeps one execution's busy threads and processes from starving the execution on
the other worker), running `cascade.sandbox.nsworker` under the system interpreter. Each execution then
costs a few forks and an `unshare`, not an interpreter start (see `nsworker`). A worker that
stops answering is killed with its whole cgroup and restarted; its job comes back as
`infra_error`, never as a reward of 0.

The pool's staged harness directory, `<tmp>/cascade-sandbox-<pid>-XXXX`, holds an `flock` on its
`.lock` file for the pool's lifetime. It is removed by `close()`, and for the process's own pools
at interpreter exit (`atexit`), at a multiprocessing or billiard process's exit (their
finalizers), by `close_pools()` (the reward workers call it at Celery's `worker_process_shutdown`:
a prefork child leaves through `os._exit`, past `atexit`), and on a SIGTERM that would otherwise
kill the process outright. What a SIGKILL leaves is removed by the next pool to start on the host:
a directory whose lock can be taken, or one without a lock file whose pid is dead.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import multiprocessing.util
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from cascade.sandbox import cgroups

HERE = Path(__file__).resolve().parent
HARNESS_FILES = {
    f"cascade/{name}": HERE.parent / name
    for name in (
        "__init__.py",
        "sandbox/__init__.py",
        "sandbox/nsworker.py",
        "sandbox/execution.py",
        "sandbox/judge.py",
        "sandbox/runner.py",
        "sandbox/syscall_filter.py",
        "sandbox/harness.py",
    )
}
"""The in-sandbox modules (stdlib only) and the two package files above them, by their path under
/sandbox: the worker imports them as `cascade.sandbox.*` and sees nothing else of the package."""
SANDBOX_ROOT = "/sandbox"
_ENTRY = (
    f"import sys; sys.path[:] = [{SANDBOX_ROOT!r}] + [p for p in sys.path if p not in ('', '.')]; "
    "from cascade.sandbox.nsworker import main; sys.exit(main())"
)
"""The worker's `python -c`: `-I` keeps PYTHONPATH out, so the staged package's root is put first
on sys.path here, and no current-directory entry stays on it."""
_START_TIMEOUT_S = 20.0
GROUP_PREFIX = "cascade-sbx"
_BACKSTOP_SLACK_S = 5.0
_SETUP_S = 10.0
"""`nsworker.SETUP_TIMEOUT_S`: what an execution's isolation may take before its budget starts."""
PROCESSES_AT_REST = 4
"""Processes of an idle worker (its cgroup's count): bwrap, bwrap's init, the worker, its zygote."""
log = logging.getLogger(__name__)
CPU_UNBOUNDED = (
    "SANDBOX CPU UNBOUNDED: no writable cpu cgroup here (cgroup v1 `cpu` hierarchy, or `cpu` in "
    "a delegated v2 subtree), so a program's busy threads, forks or new sessions can take the "
    "cores from the program on the other worker, which then times out: one completion can cost "
    "another its reward. Run the reward workers as root or with a delegated cgroup subtree."
)

_LAUNCHER = """
import os, sys
uid = int(sys.argv[1]); procs = sys.argv[2].split(",") if sys.argv[2] else []
for path in procs:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
if os.geteuid() == 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
os.execvp(sys.argv[3], sys.argv[3:])
"""
"""Joins the worker's cgroups while still privileged, drops to the sandbox uid, execs bwrap."""


@dataclass(frozen=True)
class BwrapSettings:
    python: str = "/usr/bin/python3"
    """Interpreter inside the sandbox (stdlib only; it must live under /usr)."""
    uid: int = 61000
    """Non-root uid the sandbox runs as when the service runs as root (no passwd entry needed)."""
    bwrap: str = "bwrap"
    use_cgroups: bool = True
    """Cap memory and processes of a whole execution with cgroups when the host allows."""
    cpus_per_worker: float | None = 1.0
    """CPU quota of each worker (its judge and its execution together), in CPUs; None: none.
    Applied with `use_cgroups` where the host has a writable cpu controller."""


class SandboxUnavailable(RuntimeError):
    """The host cannot run the bubblewrap sandbox; the message says what is missing."""


STAGE_PREFIX = "cascade-sandbox-"
"""Name of a staged harness directory (in the temp dir): `cascade-sandbox-<pid>-XXXX`."""
LOCK_NAME = ".lock"
"""The file in a staged directory that its pool holds an `flock` on while it lives (bwrap binds
only the harness files, so the sandbox never sees it)."""


def stage_harness(parent: Path | None = None) -> Path:
    """Copies of the in-sandbox files in a fresh world-readable directory: the sandbox uid may not
    be able to reach the installed package (say, under /root), and it sees nothing else of it.
    Named after this process (`cascade-sandbox-<pid>-XXXX`), in `parent` (default: the temp dir)."""
    staged = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=parent))
    for name, source in HARNESS_FILES.items():
        target = staged / name
        for parent_dir in reversed(target.relative_to(staged).parents[:-1]):
            (staged / parent_dir).mkdir(exist_ok=True)
            (staged / parent_dir).chmod(0o755)
        shutil.copyfile(source, target)
        target.chmod(0o644)
    staged.chmod(0o755)
    return staged


def lock_staged(staged: Path) -> int:
    """Create `staged`'s lock file and hold an exclusive `flock` on it: the returned descriptor,
    open until the directory is removed (the kernel drops the lock when the process dies)."""
    fd = os.open(staged / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staged(parent: Path | None = None) -> list[Path]:
    """Remove the staged directories whose pool is gone (its process was killed): those whose lock
    file can be locked, and those without one (an older layout, or a pool killed while staging)
    whose pid, in the name, is dead. A directory whose lock is held, or without a pid in its name
    and no lock file, is kept. Returns the directories removed."""
    removed: list[Path] = []
    for directory in Path(parent or tempfile.gettempdir()).glob(f"{STAGE_PREFIX}*"):
        if directory.is_symlink() or not directory.is_dir():
            continue
        try:
            fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            owner = directory.name.removeprefix(STAGE_PREFIX).split("-", 1)[0]
            if owner.isdigit() and not _pid_alive(int(owner)):
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(directory)
            continue
        except OSError:  # another user's, or not ours to judge
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its pool is alive
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        finally:
            os.close(fd)
    return removed


def bwrap_argv(settings: BwrapSettings, harness_dir: Path, exec_procs: Sequence[Path] = ()) -> list[str]:
    """The worker's command line; `exec_procs` are the cgroup.procs files of the executions'
    own groups, bound writable at /sandbox/cgroup/<n>.procs for each execution to join."""
    binary = shutil.which(settings.bwrap)
    if binary is None:
        raise SandboxUnavailable(
            f"bubblewrap not found ({settings.bwrap!r}): install the Debian/Ubuntu package `bubblewrap`"
        )
    python = os.path.realpath(settings.python)
    if not python.startswith("/usr/") or not os.access(python, os.X_OK):
        raise SandboxUnavailable(f"sandbox python {settings.python!r} must be an executable under /usr")
    argv = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", SANDBOX_ROOT]
    for name in HARNESS_FILES:  # each file on its own: nothing else of the staging directory
        argv += ["--ro-bind", str(harness_dir / name), f"{SANDBOX_ROOT}/{name}"]
    for number, procs in enumerate(exec_procs):
        argv += ["--bind", str(procs), f"/sandbox/cgroup/{number}.procs"]
    argv += ["--remount-ro", "/", "--hostname", "sandbox", "--chdir", "/tmp"]
    argv += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]
    return argv + [python, "-I", "-S", "-B", "-c", _ENTRY]


class _Spawner:
    """Starts worker processes from one long-lived thread.

    bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that forked
    it exits: a worker (re)started from a short-lived thread (a batch's driver thread, an RPC
    handler) would be killed with that thread. This thread lives as long as the process.
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._owner = -1
        self._lock = threading.Lock()

    def spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._executor is None or self._owner != os.getpid():  # none yet, or we were forked
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="sandbox-spawner")
                self._owner = os.getpid()
            executor = self._executor
        pipe = subprocess.PIPE
        return executor.submit(subprocess.Popen, argv, stdin=pipe, stdout=pipe, stderr=pipe, env={}).result()


_SPAWNER = _Spawner()


class SandboxWorker:
    """One warm worker process; `execute` runs one job on it (callers serialise per worker)."""

    def __init__(self, settings: BwrapSettings, name: str, harness_dir: Path) -> None:
        self.settings, self.name, self.harness_dir = settings, name, harness_dir
        self.group: cgroups.WorkerGroup | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._limits: tuple[int, int] | None = None
        self._base_pids = 0
        self.restarts = 0

    def start(self) -> None:
        uid = self.settings.uid if os.geteuid() == 0 else os.geteuid()
        bwrap_argv(self.settings, self.harness_dir)  # SandboxUnavailable before any cgroup is made
        if self.settings.use_cgroups and cgroups.available():
            self.group = cgroups.WorkerGroup.create(
                self.name, owner_uid=uid, cpus=self.settings.cpus_per_worker
            )
            self._limits = None
        exec_procs = [d / "cgroup.procs" for d in self.group.exec_dirs()] if self.group else []
        argv = bwrap_argv(self.settings, self.harness_dir, exec_procs)
        procs = ",".join(str(d / "cgroup.procs") for d in self._group_dirs())
        launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(uid), procs, *argv]
        self.proc = _SPAWNER.spawn(launcher)
        self._buffer = b""
        hello = self._read_line(time.monotonic() + _START_TIMEOUT_S)
        if hello is None or not hello.get("ready"):
            errors = self._stop_and_read_stderr()
            raise SandboxUnavailable(f"sandbox worker did not start: {errors or 'no output'}")
        self._base_pids = len(self.group.pids()) if self.group is not None else 0

    def _group_dirs(self) -> list[Path]:
        return [] if self.group is None else self.group.dirs()

    def execute(self, job: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.restart()
        assert self.proc is not None and self.proc.stdin is not None
        limits = job["limits"]
        oom_before = 0
        if self.group is not None:
            wanted = (int(limits["memory_mb"]), int(limits["max_processes"]))
            if wanted != self._limits:
                self.group.set_limits(*wanted)
                self._limits = wanted
            oom_before = self.group.oom_kills()
        backstop = limits["time_limit_s"] + 2 * _SETUP_S + _BACKSTOP_SLACK_S
        try:
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            self.proc.stdin.flush()
            result = self._read_line(time.monotonic() + backstop)
        except OSError:
            result = None
        if result is None or result.get("i") != job["i"]:
            self.restart()
            detail = f"sandbox worker {self.name} stopped answering and was restarted"
            log.warning("%s (job %s)", detail, job["i"])
            return _infra(job, detail)
        if self.group is not None and self.group.oom_kills() > oom_before and result["status"] != "ok":
            result.update(status="memory_limit", detail=f"killed at the {limits['memory_mb']} MB memory cap")
        if result.get("status") == "infra_error":
            log.warning(
                "sandbox worker %s: infra_error on job %s: %s", self.name, job["i"], result.get("detail")
            )
        if not self._settled():
            self.restart()  # something of the execution outlived it: never let it meet the next one
        return result

    def _settled(self, wait_s: float = 2.0) -> bool:
        """Whether the worker's cgroup is back to the worker's own processes (without cgroups the
        execution's PID namespace guarantees it)."""
        if self.group is None:
            return True
        deadline = time.monotonic() + wait_s
        while len(self.group.pids()) > self._base_pids:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _read_line(self, deadline: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            record = json.loads(line)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def restart(self) -> None:
        self.restarts += 1
        self.stop()
        self.start()

    def _stop_and_read_stderr(self) -> str:
        proc = self.proc
        self.stop()
        if proc is None or proc.stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            return proc.stderr.read().decode(errors="replace").strip()[-500:]
        return ""

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        if self.group is not None:
            self.group.remove()
            self.group = None
        self.proc = None


def _infra(job: dict[str, Any], detail: str) -> dict[str, Any]:
    return {
        "i": job["i"],
        "status": "infra_error",
        "passed": 0,
        "total": len(job["tests"]),
        "detail": detail,
        "seconds": 0.0,
    }


class SandboxPool:
    """`size` warm workers; `run(jobs)` spreads jobs over them and returns results in order."""

    def __init__(self, size: int, settings: BwrapSettings | None = None) -> None:
        self.settings = settings or BwrapSettings()
        self.owner = os.getpid()
        if self.settings.use_cgroups and cgroups.available():
            cgroups.remove_stale(GROUP_PREFIX)
        tag = f"{GROUP_PREFIX}-{os.getpid()}-{id(self) % 100000}"
        for stale in remove_stale_staged():
            log.info("removed the stale sandbox directory %s", stale)
        _clean_at_exit()
        self.harness_dir = stage_harness()
        self._lock_fd: int | None = None
        try:
            self._lock_fd = lock_staged(self.harness_dir)
        except BaseException:
            shutil.rmtree(self.harness_dir, ignore_errors=True)
            raise
        self.workers = [
            SandboxWorker(self.settings, f"{tag}-{i}", self.harness_dir) for i in range(max(1, size))
        ]
        self._lock = threading.Lock()
        try:
            for worker in self.workers:
                worker.start()
        except BaseException:
            self.close()
            raise
        if self.settings.cpus_per_worker is not None and not self.cpu_bounded():
            log.warning(CPU_UNBOUNDED)

    def cpu_bounded(self) -> bool:
        """Whether every worker runs under its CPU quota."""
        return all(w.group is not None and w.group.cpu_limit() is not None for w in self.workers)

    def run(self, jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(jobs)):
            todo.put(index)
        results: list[dict[str, Any] | None] = [None] * len(jobs)

        def drain(worker: SandboxWorker) -> None:
            while True:
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                job = {**jobs[index], "i": index}
                try:
                    results[index] = worker.execute(job)
                except Exception as err:  # a worker that cannot even restart
                    results[index] = _infra(job, f"sandbox worker failed: {err}")

        with self._lock:  # one batch at a time; each worker is driven by one thread
            threads = [threading.Thread(target=drain, args=(w,), daemon=True) for w in self.workers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return [
            r if r is not None else _infra({"i": i, "tests": []}, "not run") for i, r in enumerate(results)
        ]

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        shutil.rmtree(self.harness_dir, ignore_errors=True)
        if self._lock_fd is not None:  # released only once the directory is gone
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


_pools: dict[tuple[int, BwrapSettings], SandboxPool] = {}
_pools_lock = threading.Lock()


def shared_pool(size: int, settings: BwrapSettings | None = None) -> SandboxPool:
    """The process's pool for (size, settings), started on first use (and again after a fork)."""
    key = (size, settings or BwrapSettings())
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool.owner != os.getpid():
            pool = _pools[key] = SandboxPool(size, key[1])
        return pool


def close_pools() -> None:
    """Close this process's pools (their workers and directories); a later `shared_pool` starts
    a new one. For exits that skip `atexit`: the reward workers call it at Celery's
    `worker_process_shutdown`."""
    for pool in list(_pools.values()):
        if pool.owner == os.getpid():
            with contextlib.suppress(Exception):
                pool.close()
    _pools.clear()


atexit.register(close_pools)

_cleanup_pid = -1
"""The process whose exit hooks are registered (a forked child registers its own)."""


def _clean_at_exit() -> None:
    """Register `close_pools` with the exits of this process that skip `atexit`: a
    multiprocessing or billiard process's finalizers, and a SIGTERM that would kill it outright."""
    global _cleanup_pid
    if _cleanup_pid == os.getpid():
        return
    _cleanup_pid = os.getpid()
    multiprocessing.util.Finalize(None, close_pools, exitpriority=10)  # billiard's registry too
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                # Only where SIGTERM kills at once: a handler of the process's own (Celery's warm
                # shutdown, a gRPC front's) decides how it stops, and `atexit` cleans after it.
                signal.signal(signal.SIGTERM, _close_pools_and_die)


def _close_pools_and_die(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler where it had none: close the pools, then die of the signal as before."""
    try:
        close_pools()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

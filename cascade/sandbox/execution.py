"""One sandboxed execution's processes: A, B (the execution's init) and C (the program process).

Stdlib only; runs inside the sandbox, started by the zygote (`nsworker`) in a fresh fork of
itself for every execution. A enters the namespaces, B isolates them and reports how C ended,
C drops every privilege, loads the seccomp filter and only then receives the program from the
judge (`runner`). See `nsworker` for the whole picture.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
from typing import Any, NoReturn

from cascade.sandbox import harness, runner, syscall_filter

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 24, 28
PR_SET_NO_NEW_PRIVS = 38
SECURE_BITS = 0xEF
"""NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, each locked."""
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_LAST_CAP = 63
TMPFS_BYTES = 64 << 20
"""Size of each execution's /tmp (files also obey RLIMIT_FSIZE; tmpfs pages count in the memcg)."""
CGROUP_DIR = "/sandbox/cgroup"
"""Where the pool binds the cgroup.procs files of the executions' own groups."""
STOP_SIGNAL = signal.SIGUSR1
"""Z to A: end the execution now (A kills B and waits until the namespace is empty)."""
NAMESPACE_SYSCTLS = {
    "kernel/shmmax": str(16 << 20),
    "kernel/shmall": str((16 << 20) // 4096),
    "kernel/shmmni": "16",
    "kernel/msgmni": "16",
    "kernel/msgmnb": "65536",
    "kernel/msgmax": "8192",
    "kernel/sem": "32 512 32 16",
    "fs/mqueue/queues_max": "4",
    "user/max_inotify_instances": "16",
    "user/max_user_namespaces": "1",
    **{f"user/max_{kind}_namespaces": "0" for kind in ("mnt", "pid", "net", "ipc", "uts", "cgroup")},
}
"""Written in the execution's own IPC and user namespaces (System V IPC and POSIX queues capped;
one nested user namespace, the program process's own, and no other namespace), then /proc/sys
is made read-only."""

_libc = ctypes.CDLL(None, use_errno=True)
try:
    _FILTER: bytes | None = syscall_filter.build()
    _FILTER_ERROR = ""
except (KeyError, AssertionError) as _err:
    _FILTER, _FILTER_ERROR = None, f"seccomp: {syscall_filter.supported() or _err}"


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _report(fd: int, record: dict[str, Any]) -> None:
    with contextlib.suppress(BaseException):
        os.write(fd, json.dumps(record).encode() + b"\n")


def run(limits: dict[str, Any], fds: list[int], uid: int, gid: int) -> NoReturn:
    """A: enter the execution's namespaces, fork its init, wait for it. Never returns."""
    code = 0
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "pdeathsig")
        # Z is not dumpable, which makes /proc/self/* root's; A writes its own maps and score.
        _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
        _write("/proc/self/oom_score_adj", "1000")  # the OOM killer's first choice, not the worker
        _join_exec_cgroups()
        flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWPID
        _check(_libc.unshare(flags), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")
        signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})
        pid = os.fork()
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
            _init(limits, fds, uid, gid)
        for fd in fds:
            os.close(fd)
        # Stopping means killing B: the kernel then kills the rest of its namespace, and B is
        # reaped only once all of it is gone, so when A exits nothing of the execution is left.
        signal.signal(STOP_SIGNAL, lambda *_: os.kill(pid, signal.SIGKILL))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
        os.waitpid(pid, 0)
    except BaseException as err:
        _report(fds[2], {"setup_error": f"namespaces: {err}"})
        code = 70
    finally:
        os._exit(code)


def _join_exec_cgroups() -> None:
    """A: into the executions' own memory and pids groups (where the host has cgroups): an
    execution at its cap is OOM-killed there, however it sets its oom_score_adj."""
    if os.path.isdir(CGROUP_DIR):
        for name in sorted(os.listdir(CGROUP_DIR)):
            _write(os.path.join(CGROUP_DIR, name), "0")


def _init(limits: dict[str, Any], fds: list[int], uid: int, gid: int) -> NoReturn:
    """B, PID 1 of the execution: isolate, fork the program process, report how it ended."""
    to_program, from_program, status = fds
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "pdeathsig")
        _private_mounts()
        _namespace_limits()
        pid = os.fork()
        if pid == 0:
            _program(harness.SandboxLimits(**limits), fds, uid, gid)
        os.close(to_program)
        os.close(from_program)
    except BaseException as err:
        _report(status, {"setup_error": f"init: {err}"})
        os._exit(70)
    while True:  # as PID 1 it reaps orphans too; the program process's end ends the execution
        try:
            reaped, wait_status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if reaped == pid:
            sig = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else 0
            exit_code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else -1
            _report(status, {"end": True, "signal": sig, "exit": exit_code, "maxrss_kb": usage.ru_maxrss})
            os._exit(0)


def _private_mounts() -> None:
    """B: private /tmp, /dev/shm and /proc; /dev read-only (the root already is)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMPFS_BYTES},mode=0700")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=0700")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    keep = os.statvfs("/dev").f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096)
    _mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def _namespace_limits() -> None:
    """B: IPC caps and no nested namespaces, written in this execution's namespaces only; then
    /proc/sys read-only, so the program (uid 0 of its user namespace) cannot write them back."""
    for name, value in NAMESPACE_SYSCTLS.items():
        try:
            _write(f"/proc/sys/{name}", value)
        except OSError as err:
            raise OSError(
                err.errno, f"cannot set {name.replace('/', '.')} in the execution's namespace: {err}"
            ) from None
    _mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
    _mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_privileges() -> None:
    """C: root's special cases off for good, the bounding set and every capability set emptied,
    no_new_privs for anything it execs."""
    _check(_libc.prctl(PR_SET_SECUREBITS, SECURE_BITS, 0, 0, 0), "securebits")
    for cap in range(_LAST_CAP + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past last
            break
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _leave_root(uid: int, gid: int) -> None:
    """C: a user namespace of its own in which it is `uid`, not root (that maps to root of the
    execution's namespace, itself the sandbox uid outside). Its capabilities there cover no
    other namespace, and they are dropped next."""
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    _check(_libc.unshare(CLONE_NEWUSER), "unshare user namespace")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} 0 1")
    _write("/proc/self/gid_map", f"{gid} 0 1")
    # It stays dumpable: it may read its own memory (/proc/self/mem), which holds nothing it
    # must not see; nothing else it could reach would hold more (ptrace is filtered anyway).


def _detach(keep: list[int]) -> None:
    """New session; fds 0-2 on /dev/null; every other fd but `keep` closed."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _program(limits: harness.SandboxLimits, fds: list[int], uid: int, gid: int) -> NoReturn:
    """C: its own user namespace (not root), limits, no privileges, the seccomp filter; then,
    and only then, the program."""
    to_program, from_program, status = fds
    try:
        _leave_root(uid, gid)
        _detach(fds)
        os.chdir("/tmp")
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"})
        harness.apply_limits(limits, max(fds), harness.cpu_seconds(limits))
        _drop_privileges()
        if _FILTER is None:
            raise OSError(_FILTER_ERROR)
        syscall_filter.install(_FILTER)
        os.write(status, b'{"ready": true}\n')
        os.close(status)
    except BaseException as err:
        _report(status, {"setup_error": f"program process: {err}"})
        os._exit(70)
    runner.serve(limits, to_program, from_program)
    os._exit(0)  # serve() never returns

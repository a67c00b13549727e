"""The warm sandbox worker: runs inside bubblewrap and forks one isolated child per execution.

Started by `cascade.sandbox.pool` as `bwrap ... python3 -I -S /sandbox/nsworker.py` (a
non-root uid, all namespaces unshared, read-only root, empty environment). Stdlib only: it
runs with the system interpreter and no site-packages. Protocol: one JSON job per stdin line
(`{"i", "code", "tests", "entry_point", "stop_on_failure", "limits"}`), one JSON result per
stdout line (`{"i", "status", "passed", "total", "detail", "seconds", "maxrss_kb", "signal"}`).

Per execution the worker forks A, which enters fresh user, mount, IPC, network, UTS and PID
namespaces, then forks B, the first process of the new PID namespace. B mounts private tmpfs
on /tmp and /dev/shm and a /proc that shows only its own namespace, remounts /dev read-only,
starts a session, sets its rlimits, drops every capability, sets no_new_privs and runs the
tests (the same test driver as the plain-process harness, `sandbox_harness._run_tests`). When
B exits, or the worker kills A at the wall-clock limit (B dies with A: PDEATHSIG), the kernel
kills everything left in B's PID namespace, and its tmpfs, IPC objects and network
namespace go with it: nothing survives into the next execution. B is a fork, so the
program's module state dies with it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import judge  # noqa: E402  (bound next to this file in the sandbox)
import sandbox_harness as harness  # noqa: E402

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_LAST_CAP = 63
TMPFS_BYTES = 64 << 20
"""Size of each execution's /tmp (files also obey RLIMIT_FSIZE; tmpfs pages count in the memcg)."""

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_namespaces(uid: int, gid: int) -> None:
    """A: fresh namespaces; the same uid/gid mapped inside, so nothing runs as (namespace) root."""
    # The worker is not dumpable, which makes /proc/self/*_map root's; A writes its own maps.
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWPID
    _check(_libc.unshare(flags), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _private_mounts() -> None:
    """B: private /tmp, /dev/shm and /proc; /dev read-only (the root already is)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMPFS_BYTES},mode=0700")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=0700")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    keep = os.statvfs("/dev").f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096)
    _mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_privileges() -> None:
    """B: empty the bounding set and every capability set; no_new_privs for anything it execs."""
    for cap in range(_LAST_CAP + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past last
            break
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _child_b(job: dict[str, Any], limits: harness.SandboxLimits, report_fd: int) -> None:
    """First process of the execution's PID namespace: isolate, then judge C's answers. Never returns.

    The program runs in C, a child of B; B only sends it test inputs and compares what comes
    back, so a program cannot forge its verdict (B is not dumpable and C has no capabilities,
    so C cannot write into B either; killing B ends the execution as a runtime error).
    """
    code = 0
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "pdeathsig")
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")
        _private_mounts()
        harness.detach(report_fd)
        os.chdir("/tmp")
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"})
        judge.judge(job, limits, report_fd, _start_program)
    except BaseException as err:
        _report_failure(report_fd, f"sandbox setup: {err}")
        code = 70
    finally:
        os._exit(code)


def _start_program(limits: harness.SandboxLimits, keep_fds: tuple[int, int], cpu_seconds: int) -> None:
    """In C, before the program's code runs: limits, no capabilities, no_new_privs."""
    harness.apply_limits(limits, max(keep_fds), cpu_seconds)
    _drop_privileges()


def _report_failure(report_fd: int, detail: str) -> None:
    """The isolation itself failed: an `infra_error` line, never a verdict on the program."""
    with contextlib.suppress(BaseException):
        line = json.dumps({"status": harness.INFRA_ERROR, "passed": 0, "detail": detail})
        os.write(report_fd, line.encode() + b"\n")


def _child_a(job: dict[str, Any], limits: harness.SandboxLimits, report_fd: int, uid: int, gid: int) -> None:
    """Enter the namespaces, fork B into them, report B's end (signal, peak RSS). Never returns."""
    code = 0
    try:
        _enter_namespaces(uid, gid)
        pid = os.fork()
        if pid == 0:
            _child_b(job, limits, report_fd)
        _, status, usage = os.wait4(pid, 0)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        end = {"end": True, "signal": sig, "exit": exit_code, "maxrss_kb": usage.ru_maxrss}
        os.write(report_fd, json.dumps(end).encode() + b"\n")
    except BaseException as err:
        _report_failure(report_fd, f"namespaces: {err}")
        code = 70
    finally:
        os._exit(code)


def run_one(job: dict[str, Any], uid: int, gid: int) -> dict[str, Any]:
    limits = harness.SandboxLimits(**job["limits"])
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child_a(job, limits, write_fd, uid, gid)
    os.close(write_fd)
    # B enforces the per-test limit; this backstop covers a B that stops reporting.
    deadline = started + limits.time_limit_s * (len(job["tests"]) + 1) + 1.0
    buffer, passed, final, end, timed_out = b"", 0, None, None, False
    while True:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([read_fd], [], [], wait)[0]:
            timed_out = True
            break
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line == b"+":
                passed += 1
            elif line:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("end"):
                        end = record
                    elif final is None:
                        final = record
        if len(buffer) > 65536:  # junk in the report pipe
            break
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read_fd)
    result = _verdict(limits, passed, final, end, timed_out)
    result.update(i=job["i"], total=len(job["tests"]), seconds=round(time.monotonic() - started, 4))
    return result


def _verdict(
    limits: harness.SandboxLimits,
    passed: int,
    final: dict[str, Any] | None,
    end: dict[str, Any] | None,
    timed_out: bool,
) -> dict[str, Any]:
    sig = int(end["signal"]) if end else 0
    maxrss_kb = int(end["maxrss_kb"]) if end else 0
    out: dict[str, Any] = {"signal": sig, "maxrss_kb": maxrss_kb}
    if final is not None:
        detail = str(final.get("detail", ""))[:300]
        out.update(status=final.get("status", harness.RUNTIME_ERROR), passed=int(final.get("passed", 0)))
        out["detail"] = detail
        return out
    out["passed"] = passed
    if timed_out:
        out.update(status=harness.TIMEOUT, detail=f"killed after {limits.time_limit_s:g}s wall clock")
    elif sig == signal.SIGXCPU:
        out.update(status=harness.TIMEOUT, detail="CPU time limit")
    elif maxrss_kb * 1024 >= 0.9 * limits.memory_mb * 2**20:
        out.update(status=harness.MEMORY_LIMIT, detail=f"died near the {limits.memory_mb} MB limit")
    elif sig:
        out.update(status=harness.RUNTIME_ERROR, detail=f"killed by signal {sig}")
    elif end is None:
        out.update(status=harness.INFRA_ERROR, detail="the execution ended without reporting")
    else:
        out.update(status=harness.RUNTIME_ERROR, detail=f"exited with code {end['exit']} before finishing")
    return out


def main() -> int:
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")  # no /proc/<pid>/mem for programs
    uid, gid = os.getuid(), os.getgid()
    sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            result = run_one(job, uid, gid)
        except Exception as err:  # the worker itself failed: infra_error, never a reward of 0
            result = {"i": job.get("i"), "status": harness.INFRA_ERROR, "passed": 0, "total": 0}
            result.update(detail=f"worker: {type(err).__name__}: {err}", seconds=0.0, signal=0, maxrss_kb=0)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

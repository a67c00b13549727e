"""The warm sandbox worker: a judge, a clean zygote, and one isolated program process per execution.

Started by `cascade.sandbox.pool` as `bwrap ... python3 -I -S -B -c ENTRY`, ENTRY running this
module's `main` from the in-sandbox modules staged read-only under /sandbox (a non-root uid, all
namespaces unshared, read-only root, empty environment). Stdlib only: it runs with the system
interpreter and no site-packages, importing `cascade.sandbox.*` from /sandbox alone. Protocol:
one JSON job per stdin line (`{"i", "code", "tests", "entry_point", "stop_on_failure", "limits"}`),
one JSON result per stdout line (`{"i", "status", "passed", "passed_tests", "total", "detail",
"seconds", "maxrss_kb", "signal"}`; `passed_tests` lists the indices of the tests passed).

Processes (the program process must hold nothing but its code and its inputs):

- W, this worker and the judge (`judge`): reads jobs, holds their tests, compares answers. Not
  dumpable. Before it reads any job it starts Z and never forks again.
- Z, the zygote: a double fork of W made at start-up (so W is not its ancestor), holding only
  the imported harness. Per execution W sends it three pipe ends and the limits (never code or
  tests); Z forks A, stops it when W asks, reaps it and says so.

The execution's own processes (`execution`):

- A: makes the execution the OOM killer's first choice (`oom_score_adj` 1000), joins the
  execution's own memory and pids cgroup (cgroup v1), enters fresh user, mount, IPC, network,
  UTS and PID namespaces (uid 0 inside, mapped to the sandbox uid), then forks B. Stopping an
  execution is a signal to A, which kills B and exits once the namespace is empty.
- B, the execution's init (PID 1 of its namespace, so the program can neither kill it nor see
  anything outside): private tmpfs /tmp and /dev/shm, a /proc of its own namespace, /dev
  read-only, IPC limits in the new IPC namespace, no nested namespaces but C's own
  (`user.max_*_namespaces`), then /proc/sys read-only. Forks C, reports how C ended, exits:
  the kernel then kills everything left in the namespace, and its tmpfs, IPC objects and
  network go with it.
- C, the program process: a user namespace of its own in which it is the sandbox uid, not root;
  new session, rlimits, every capability and the bounding set dropped,
  SECBIT_NOROOT locked, no_new_privs, the seccomp filter (`syscall_filter`); says `ready` on the
  status pipe, closes it, and only then receives the code and the test inputs (`runner`).

W kills the execution (through Z) when its one budget runs out or its tests are done.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import select
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from cascade.sandbox import execution, harness, judge

SETUP_TIMEOUT_S = 10.0
"""How long an execution's isolation may take before it is the sandbox's failure."""
_STOP_GRACE_S = 2.0
"""How long A may take to stop before Z kills it outright."""
PR_SET_DUMPABLE = 4


# --------------------------------------------------------------------------- the zygote (Z)


class Zygote:
    """W's handle on Z: start executions, end them, know when they are gone."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def start(cls, uid: int, gid: int) -> Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            if os.fork() == 0:
                _zygote_main(theirs, uid, gid)
            os._exit(0)
        theirs.close()
        os.waitpid(pid, 0)
        return cls(ours)

    def spawn(self, limits: dict[str, Any], fds: list[int]) -> None:
        socket.send_fds(self.sock, [json.dumps({"limits": limits}).encode()], fds)
        self._receive("pid")

    def finish(self) -> None:
        """Kill the execution (if it still runs) and wait until all of it is gone."""
        with contextlib.suppress(OSError):
            self.sock.send(b"kill")
        self._receive("exit")

    def _receive(self, key: str) -> dict[str, Any]:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([self.sock], [], [], wait)[0]:
                raise ZygoteLost(f"the zygote did not answer within {SETUP_TIMEOUT_S:g}s")
            message = json.loads(self.sock.recv(4096) or b"null")
            if not isinstance(message, dict):
                raise ZygoteLost("the zygote is gone")
            if "error" in message:
                raise ZygoteLost(f"the zygote cannot fork: {message['error']}")
            if key in message:
                return message


class ZygoteLost(RuntimeError):
    """Z died or stopped answering: the worker must be restarted."""


def _zygote_main(sock: socket.socket, uid: int, gid: int) -> NoReturn:
    """Z: fork one execution per request, never holding more than its limits and pipe ends."""
    try:
        while True:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
            if not message:
                break
            if len(fds) != 3:  # a "kill" for an execution that already ended
                for fd in fds:
                    os.close(fd)
                continue
            request = json.loads(message)
            try:
                pid = os.fork()
            except OSError as err:
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"error": str(err)}).encode())
                continue
            if pid == 0:
                sock.close()
                execution.run(request["limits"], fds, uid, gid)
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"pid": pid}).encode())
            sock.send(json.dumps({"exit": _supervise(sock, pid)}).encode())
    finally:
        os._exit(0)


def _supervise(sock: socket.socket, pid: int) -> int:
    """Wait until A ends, stopping it when W says so (or is gone); its wait status."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: poll
        pidfd = -1
    backstop = math.inf
    try:
        while True:
            watch = [sock] + ([pidfd] if pidfd >= 0 else [])
            wait = min(backstop - time.monotonic(), 1.0 if pidfd >= 0 else 0.005)
            if sock in select.select(watch, [], [], max(0.0, wait))[0]:
                sock.recv(64)  # "kill", or nothing when W is gone: either way
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, execution.STOP_SIGNAL)
                backstop = min(backstop, time.monotonic() + _STOP_GRACE_S)
            if time.monotonic() >= backstop:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # B then dies of PDEATHSIG
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
    finally:
        if pidfd >= 0:
            os.close(pidfd)


# --------------------------------------------------------------------------- the worker and judge (W)


def run_one(job: dict[str, Any], zygote: Zygote) -> dict[str, Any]:
    limits = harness.SandboxLimits(**job["limits"])
    started = time.monotonic()
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    status_r, status_w = os.pipe()
    channel = judge.Channel(to_w, from_r, status_r, limits)
    try:
        try:
            zygote.spawn(job["limits"], [to_r, from_w, status_w])
        finally:
            for fd in (to_r, from_w, status_w):
                os.close(fd)
        try:
            status, passed, detail = judge.judge(job, channel, SETUP_TIMEOUT_S)
        finally:
            zygote.finish()
    finally:
        channel.close()
    end = channel.end or {}
    return {
        "i": job["i"],
        "status": status,
        "passed": len(passed),
        "passed_tests": passed,
        "total": len(job["tests"]),
        "detail": detail,
        "seconds": round(time.monotonic() - started, 4),
        "signal": int(end.get("signal", 0)),
        "maxrss_kb": int(end.get("maxrss_kb", 0)),
    }


def _infra(job: Any, detail: str) -> dict[str, Any]:
    i = job.get("i") if isinstance(job, dict) else None
    return {"i": i, "status": harness.INFRA_ERROR, "passed": 0, "total": 0, "detail": detail, "seconds": 0.0}


def main() -> int:
    execution._check(
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable"
    )  # no /proc/<pid>/mem, no ptrace
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # inherited: an init ignores what it does not handle
    zygote = Zygote.start(os.getuid(), os.getgid())  # before any job is read: Z never sees one
    sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            result = run_one(job, zygote)
        except ZygoteLost as err:  # the worker cannot go on: report, exit, be restarted
            sys.stdout.write(json.dumps(_infra(job, f"sandbox worker: {err}")) + "\n")
            sys.stdout.flush()
            return 1
        except Exception as err:  # the worker itself failed: infra_error, never a reward of 0
            result = _infra(job, f"sandbox worker: {type(err).__name__}: {err}")
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

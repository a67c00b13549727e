"""Judge and program halves of one sandboxed execution (stdlib only; runs inside the sandbox).

The judge (B) forks the program process (C), sends it one test input at a time over a pipe
and compares the JSON it sends back with the expected output; C runs the untrusted code under
rlimits with no capabilities. The verdict is decided in B, so code in C cannot forge it. Each
test, and loading the module, gets `time_limit_s` of wall clock; past it B kills C (`timeout`).

Reasons are those of `sandbox_harness` (`ok`, `wrong_answer`, `timeout`, `memory_limit`,
`runtime_error`, `output_limit`, `parse_error`, `infra_error`).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import sandbox_harness as harness

PrepareProgram = Callable[[harness.SandboxLimits, tuple[int, int], int], None]
"""Called in C before untrusted code runs: (limits, fds C keeps, CPU seconds)."""

_REPLY_SLACK = 65536
"""Bytes a reply may carry beyond the output budget (JSON framing, returned values)."""


class _Ended(Exception):
    """C stopped answering: it exited, was killed, timed out or wrote junk."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class _ProgramChannel:
    """B's side of the pipes to C, with a wall-clock deadline per reply and a size cap."""

    def __init__(self, pid: int, read_fd: int, write_fd: int, limits: harness.SandboxLimits) -> None:
        self.pid, self.read_fd, self.write_fd, self.limits = pid, read_fd, write_fd, limits
        self.buffer = b""
        self.max_line = limits.max_output_bytes + _REPLY_SLACK

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            _write_all(self.write_fd, json.dumps(request).encode() + b"\n")
        except OSError:
            raise self._dead() from None
        return self.receive()

    def receive(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.limits.time_limit_s
        while b"\n" not in self.buffer:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([self.read_fd], [], [], wait)[0]:
                self.kill()
                raise _Ended(harness.TIMEOUT, f"test ran past {self.limits.time_limit_s:g}s wall clock")
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                raise self._dead()
            self.buffer += chunk
            if len(self.buffer) > self.max_line:
                self.kill()
                raise _Ended(
                    harness.OUTPUT_LIMIT, f"more than {self.limits.max_output_bytes} bytes of output"
                )
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            self.kill()
            raise _Ended(harness.RUNTIME_ERROR, "the program wrote into the judge's pipe")
        return reply

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def _dead(self) -> _Ended:
        _, status, usage = os.wait4(self.pid, 0)
        self.pid = -1
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
            return _Ended(harness.TIMEOUT, "CPU time limit")
        if usage.ru_maxrss * 1024 >= 0.9 * self.limits.memory_mb * 2**20:
            return _Ended(harness.MEMORY_LIMIT, f"died near the {self.limits.memory_mb} MB limit")
        if os.WIFSIGNALED(status):
            return _Ended(harness.RUNTIME_ERROR, f"killed by signal {os.WTERMSIG(status)}")
        return _Ended(harness.RUNTIME_ERROR, f"exited with code {os.WEXITSTATUS(status)} during the tests")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def judge(
    job: dict[str, Any], limits: harness.SandboxLimits, report_fd: int, prepare: PrepareProgram
) -> None:
    """Run `job`'s tests against a program process; write `+` per pass and a final JSON line."""
    tests: list[dict[str, Any]] = job["tests"]
    cpu_seconds = int(limits.time_limit_s * (len(tests) + 1)) + 1
    to_program_r, to_program_w = os.pipe()
    from_program_r, from_program_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(to_program_w)
        os.close(from_program_r)
        os.close(report_fd)
        _program_main(
            job, limits, to_program_r, from_program_w, lambda lim, fds: prepare(lim, fds, cpu_seconds)
        )
    os.close(to_program_r)
    os.close(from_program_w)
    channel = _ProgramChannel(pid, from_program_r, to_program_w, limits)
    passed = 0

    def report(status: str, detail: str = "") -> None:
        line = json.dumps({"status": status, "passed": passed, "detail": detail[:300]})
        os.write(report_fd, line.encode() + b"\n")

    try:
        loaded = channel.receive()
        if "err" in loaded:
            return report(*_reason(loaded["err"]))
        first_failure: tuple[str, str] | None = None
        for number, test in enumerate(tests):
            failure = _run_test(channel, job, number, test)
            if failure is None:
                passed += 1
                os.write(report_fd, b"+\n")
                continue
            first_failure = first_failure or failure
            if job.get("stop_on_failure", True) or failure[0] != harness.WRONG_ANSWER:
                break
        report(*(first_failure or (harness.OK, "")))
    except _Ended as ended:
        report(ended.status, ended.detail)
    finally:
        channel.kill()
        if channel.pid > 0:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(channel.pid, 0)


def _run_test(
    channel: _ProgramChannel, job: dict[str, Any], number: int, test: dict[str, Any]
) -> tuple[str, str] | None:
    if "stdin" in test:
        reply = channel.ask({"stdin": str(test["stdin"])})
        if "err" in reply:
            return _reason(reply["err"])
        got, expected = str(reply.get("stdout", "")), str(test.get("stdout", ""))
        if harness._same_stdout(got, expected):
            return None
        return (
            harness.WRONG_ANSWER,
            f"test {number}: stdout {harness._short(got)}, expected {harness._short(expected)}",
        )
    if not job.get("entry_point"):
        return harness.INFRA_ERROR, "function-call test but the job has no entry_point"
    args = test["args"] if "args" in test else [test["input"]]
    reply = channel.ask({"args": args})
    if "err" in reply:
        return _reason(reply["err"])
    if harness._same_value(reply.get("value"), test["output"]):
        return None
    shown = f"{job['entry_point']}({', '.join(map(repr, args))})"[:80]
    got = harness._short(reply.get("value"))
    return harness.WRONG_ANSWER, f"test {number}: {shown} = {got}, expected {harness._short(test['output'])}"


_PROGRAM_REASONS = {
    harness.RUNTIME_ERROR,
    harness.MEMORY_LIMIT,
    harness.OUTPUT_LIMIT,
    harness.PARSE_ERROR,
    harness.WRONG_ANSWER,
}


def _reason(err: Any) -> tuple[str, str]:
    """A reason sent by C; C runs untrusted code, so it may only claim a failure, never `ok`."""
    if isinstance(err, list) and len(err) == 2 and err[0] in _PROGRAM_REASONS:
        return str(err[0]), str(err[1])[:300]
    return harness.RUNTIME_ERROR, "the program sent a malformed reply"


# --------------------------------------------------------------------------- the program (C)


def _program_main(
    job: dict[str, Any],
    limits: harness.SandboxLimits,
    read_fd: int,
    write_fd: int,
    prepare: Callable[[harness.SandboxLimits, tuple[int, int]], None],
) -> None:
    """Load the untrusted code, then answer the judge's test requests. Never returns."""
    try:
        prepare(limits, (read_fd, write_fd))
        budget = [limits.max_output_bytes, 0]
        stdout = harness._CappedStream(budget, keep=True)
        sys.stdout, sys.stderr = stdout, harness._CappedStream(budget, keep=False)

        def send(reply: dict[str, Any]) -> None:
            if budget[1]:
                reply = {
                    "err": [harness.OUTPUT_LIMIT, f"more than {limits.max_output_bytes} bytes of output"]
                }
            _write_all(write_fd, json.dumps(reply).encode() + b"\n")

        function = None
        try:
            compiled = compile(job["code"], "<solution>", "exec")
        except (SyntaxError, ValueError) as err:
            send({"err": [harness.PARSE_ERROR, f"{type(err).__name__}: {err}"]})
            os._exit(0)
        entry = job.get("entry_point")
        if entry:
            namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
            try:
                exec(compiled, namespace)
            except BaseException as err:
                send({"err": list(harness._classify(err))})
                os._exit(0)
            function = namespace.get(entry)
            if not callable(function):
                send({"err": [harness.PARSE_ERROR, f"no function {entry!r} defined"]})
                os._exit(0)
        send({"ready": True})
        requests = os.fdopen(read_fd, "rb")
        for line in requests:
            request = json.loads(line)
            try:
                if "stdin" in request:
                    reply: dict[str, Any] = {
                        "stdout": harness._run_as_script(compiled, request["stdin"], stdout)
                    }
                else:
                    assert function is not None
                    value = function(*request["args"])
                    try:
                        reply = {"value": harness._normalise(value)}
                    except BaseException:
                        reply = {
                            "err": [
                                harness.WRONG_ANSWER,
                                f"returned an unserialisable {type(value).__name__}",
                            ]
                        }
            except BaseException as err:
                reply = {"err": list(harness._classify(err))}
            send(reply)
    finally:
        os._exit(0)

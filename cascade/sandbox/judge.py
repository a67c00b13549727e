"""The judge of one sandboxed execution (stdlib only; runs in the warm worker, inside bubblewrap).

The judge is the worker process itself: it holds the job (code, inputs, expected outputs), sends
the program process (`runner`, started by `nsworker` from a clean zygote) the code and then one
test input at a time, and compares each raw answer with the expected output here. The program
process is not a fork of the judge, cannot see it (another PID namespace), read its memory (not
dumpable; no ptrace under the seccomp filter) or signal it.

Everything the program controls maps to a verdict on the program: its replies (any shape, depth
or size: `payload` type-checks each one, and any error while judging one is the program's
`runtime_error`), its exit, its signals, its silence. `infra_error` is reserved for the sandbox's own
failures (setup, a dead init process), each with its cause in the detail. One wall-clock budget,
`time_limit_s`, covers loading the program and all its tests.

Status lines come from the trusted processes of the execution (never the program): `ready` from
the program process once it is isolated and before it has the code, `setup_error`, and `end` from
the execution's init when the program process ended (its signal, exit code and peak RSS).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import select
import signal
import time
from typing import Any

from cascade.sandbox import harness

_REPLY_SLACK = 65536
"""Bytes a reply may carry beyond the output budget (JSON framing, returned values)."""
_PROGRAM_REASONS = {
    harness.RUNTIME_ERROR,
    harness.MEMORY_LIMIT,
    harness.OUTPUT_LIMIT,
    harness.PARSE_ERROR,
    harness.WRONG_ANSWER,
}
"""Failures the program process may claim for itself (never `ok`, `timeout` or `infra_error`)."""


class Ended(Exception):
    """The execution is over before all tests ran: `status` and `detail` are its verdict."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class Channel:
    """The judge's side of one execution: pipes to and from the program process, the status
    pipe from the execution's trusted processes, and the execution's one deadline."""

    def __init__(self, to_fd: int, from_fd: int, status_fd: int, limits: harness.SandboxLimits) -> None:
        self.to_fd, self.from_fd, self.status_fd, self.limits = to_fd, from_fd, status_fd, limits
        for fd in (to_fd, from_fd, status_fd):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.buffer = b""
        self.status_buffer = b""
        self.from_eof = self.status_eof = False
        self.end: dict[str, Any] | None = None
        self.records: list[dict[str, Any]] = []
        """Status lines other than `end`: `ready` or `setup_error`."""
        self.deadline = math.inf
        self.max_reply = limits.max_output_bytes + _REPLY_SLACK

    # ---------------------------------------------------------------- status (trusted)

    def wait_ready(self, setup_timeout_s: float) -> None:
        """Wait for the program process to be isolated; its budget starts now."""
        deadline = time.monotonic() + setup_timeout_s
        while not self.records:
            if self.end is not None or self.status_eof:
                raise Ended(harness.INFRA_ERROR, "sandbox setup failed: its processes ended without a word")
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([self.status_fd], [], [], wait)[0]:
                raise Ended(
                    harness.INFRA_ERROR, f"sandbox setup failed: no answer within {setup_timeout_s:g}s"
                )
            self._read_status()
        record = self.records.pop(0)
        if "setup_error" in record:
            raise Ended(harness.INFRA_ERROR, f"sandbox setup failed: {record['setup_error']}")
        self.deadline = time.monotonic() + self.limits.time_limit_s

    def _read_status(self) -> None:
        try:
            chunk = os.read(self.status_fd, 4096)
        except BlockingIOError:
            return
        if not chunk:
            self.status_eof = True
        self.status_buffer += chunk
        *lines, self.status_buffer = self.status_buffer.split(b"\n")
        for line in lines:
            record = json.loads(line)
            if record.get("end"):
                self.end = self.end or record
            else:
                self.records.append(record)

    # ---------------------------------------------------------------- the program (untrusted)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self._send(json.dumps(request).encode() + b"\n")
        return self._receive()

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            wait = self.deadline - time.monotonic()
            if wait <= 0:
                raise self._timeout()
            watch = [] if self.status_eof else [self.status_fd]
            readable, writable, _ = select.select(watch, [self.to_fd], [], wait)
            if readable:
                self._read_status()
                if self.end is not None or self.status_eof:
                    raise self._ended()
            if writable:
                try:
                    view = view[os.write(self.to_fd, view) :]
                except BlockingIOError:
                    continue
                except BrokenPipeError:  # the program closed its input: wait for what it does next
                    raise self._wait_for_end() from None

    def _receive(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            if self.end is not None or self.status_eof:
                self._drain()
                if b"\n" in self.buffer:
                    break
                raise self._ended()
            wait = self.deadline - time.monotonic()
            if wait <= 0:
                raise self._timeout()
            watch = [self.status_fd] + ([] if self.from_eof else [self.from_fd])
            readable = select.select(watch, [], [], wait)[0]
            if self.from_fd in readable:
                self._read_program()
            if self.status_fd in readable:
                self._read_status()
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except Exception:  # junk, bad UTF-8, nesting past the parser's depth, an int too long
            reply = None
        if not isinstance(reply, dict):
            raise Ended(
                harness.RUNTIME_ERROR, "the program wrote something that is not a reply into the judge's pipe"
            )
        return reply

    def _read_program(self) -> None:
        try:
            chunk = os.read(self.from_fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.from_eof = True
        self.buffer += chunk
        if len(self.buffer) > self.max_reply:
            raise Ended(harness.OUTPUT_LIMIT, f"more than {self.limits.max_output_bytes} bytes of output")

    def _drain(self) -> None:
        """Whatever the program wrote before it ended (it is in the pipe before its death is)."""
        while not self.from_eof and b"\n" not in self.buffer:
            if not select.select([self.from_fd], [], [], 0)[0]:
                return
            self._read_program()

    def _wait_for_end(self) -> Ended:
        while self.end is None and not self.status_eof:
            wait = self.deadline - time.monotonic()
            if wait <= 0 or not select.select([self.status_fd], [], [], wait)[0]:
                return self._timeout()
            self._read_status()
        return self._ended()

    def _timeout(self) -> Ended:
        budget = self.limits.time_limit_s
        return Ended(harness.TIMEOUT, f"ran past its {budget:g}s wall-clock budget (loading and all tests)")

    def _ended(self) -> Ended:
        """The verdict on a program process that ended before its tests did."""
        if self.end is None:  # the execution's init died: nothing the program can do does that
            return Ended(harness.INFRA_ERROR, "the execution's init process died without reporting")
        sig, code, maxrss_kb = (int(self.end.get(k, 0)) for k in ("signal", "exit", "maxrss_kb"))
        if sig == signal.SIGXCPU:
            return Ended(harness.TIMEOUT, "CPU time limit")
        if maxrss_kb * 1024 >= 0.9 * self.limits.memory_mb * 2**20:
            return Ended(harness.MEMORY_LIMIT, f"died near the {self.limits.memory_mb} MB limit")
        if sig:
            return Ended(harness.RUNTIME_ERROR, f"killed by signal {sig}")
        return Ended(harness.RUNTIME_ERROR, f"exited with code {code} before finishing its tests")

    def close(self) -> None:
        for fd in (self.to_fd, self.from_fd, self.status_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def judge(job: dict[str, Any], channel: Channel, setup_timeout_s: float) -> tuple[str, list[int], str]:
    """Run `job`'s tests through `channel`: (reason, indices of the tests passed, detail)."""
    passed: list[int] = []
    try:
        channel.wait_ready(setup_timeout_s)
        loaded = channel.ask({"code": job["code"], "entry_point": job.get("entry_point")})
        failure = _judged(_judge_loaded, loaded)
        if failure is not None:
            return failure[0], [], harness.clean_text(failure[1])
        first_failure: tuple[str, str] | None = None
        for number, test in enumerate(job["tests"]):
            failure = _run_test(channel, job, number, test)
            if failure is None:
                passed.append(number)
                continue
            first_failure = first_failure or failure
            if job.get("stop_on_failure", True) or failure[0] != harness.WRONG_ANSWER:
                break
        status, detail = first_failure or (harness.OK, "")
    except Ended as ended:
        status, detail = ended.status, ended.detail
    if status == harness.OUTPUT_LIMIT:
        passed = []  # even a program that caught the error gets no credit
    return status, passed, harness.clean_text(detail)


Failure = tuple[str, str]
MALFORMED = "the program sent a malformed reply"


class ProgramFailed(Exception):
    """A reply that is not the answer asked for: the verdict `(reason, detail)` on the program."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.failure = (reason, detail)


def payload(reply: Any, key: str) -> Any:
    """What a well-formed reply `{key: payload}` carries (`loaded` must be `true`, `stdout` a
    string, `value` any JSON data). Raises `ProgramFailed` with the program's own failure for a
    well-formed `{"err": [reason, detail]}` (a reason it may claim, a string detail), and with
    `runtime_error` for anything else: another shape, another key, extra keys, wrong types."""
    if not isinstance(reply, dict) or len(reply) != 1:
        raise ProgramFailed(harness.RUNTIME_ERROR, f"{MALFORMED} (expected {key!r} or 'err')")
    ((name, value),) = reply.items()
    if name == "err":
        if (
            type(value) is list
            and len(value) == 2
            and type(value[0]) is str
            and value[0] in _PROGRAM_REASONS
            and type(value[1]) is str
        ):
            raise ProgramFailed(value[0], harness.clean_text(value[1]))
        raise ProgramFailed(harness.RUNTIME_ERROR, f"{MALFORMED} (expected {key!r} or 'err')")
    well_typed = {
        "loaded": lambda v: v is True,
        "stdout": lambda v: type(v) is str,
        "value": lambda v: True,
    }
    if name != key or not well_typed[key](value):
        raise ProgramFailed(harness.RUNTIME_ERROR, f"{MALFORMED} (expected {key!r} or 'err')")
    return value


def _judged(judge_reply: Any, reply: Any, *context: Any) -> Failure | None:
    """`judge_reply(reply, ...)`: None when the reply is the right answer, else the failure.
    Any error while judging what the program sent is a verdict on the program, never the
    sandbox's failure (which `infra_error` would mask out of training, penalty and all)."""
    try:
        result: Failure | None = judge_reply(reply, *context)
        return result
    except ProgramFailed as failed:
        return failed.failure
    except Exception as err:
        return harness.RUNTIME_ERROR, f"the judge could not read the program's reply ({type(err).__name__})"


def _judge_loaded(reply: Any) -> Failure | None:
    payload(reply, "loaded")
    return None


def _judge_stdout(reply: Any, number: int, expected: str) -> Failure | None:
    got = payload(reply, "stdout")
    if _safely(harness._same_stdout, got, expected):
        return None
    wrong = f"test {number}: stdout {harness._short(got)}, expected {harness._short(expected)}"
    return harness.WRONG_ANSWER, wrong


def _judge_value(reply: Any, number: int, expected: Any, shown: str) -> Failure | None:
    got = payload(reply, "value")
    if _safely(harness._same_value, got, expected):
        return None
    wrong = f"test {number}: {shown} = {harness._short(got)}, expected {harness._short(expected)}"
    return harness.WRONG_ANSWER, wrong


def _run_test(channel: Channel, job: dict[str, Any], number: int, test: dict[str, Any]) -> Failure | None:
    if "stdin" in test:
        reply = channel.ask({"stdin": str(test["stdin"])})
        return _judged(_judge_stdout, reply, number, str(test.get("stdout", "")))
    if not job.get("entry_point"):
        return harness.INFRA_ERROR, "function-call test but the job has no entry_point"
    args = test["args"] if "args" in test else [test["input"]]
    reply = channel.ask({"args": args})
    shown = f"{job['entry_point']}({', '.join(map(repr, args))})"[:80]
    return _judged(_judge_value, reply, number, test["output"], shown)


def _safely(compare: Any, got: Any, expected: Any) -> bool:
    """A comparison of plain JSON data the judge parsed itself; one that cannot finish is a miss."""
    try:
        return bool(compare(got, expected))
    except Exception:
        return False

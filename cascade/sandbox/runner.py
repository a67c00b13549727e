"""The program side of one sandboxed execution (stdlib only; runs inside the sandbox).

Runs in the program process: a fresh fork of the worker's clean zygote (which never saw a job),
already isolated and limited by `nsworker`. It holds nothing but what it is sent here: the
program's code, then one test input at a time. It answers with raw results (a function's return
value serialised as JSON, or a script's stdout) and never sees an expected output: the judge,
in another process it cannot read or signal, compares. Everything in this process, this module
included, is the program's to tamper with; all it can gain is to send a different answer.

Protocol, one JSON object per line. In: `{"code", "entry_point"}`, then `{"args": [...]}` or
`{"stdin": str}` per test. Out: `{"loaded": true}` once the module ran, then `{"value": v}` or
`{"stdout": s}` per test; `{"err": [reason, detail]}` for a failure the program caused.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from typing import Any, NoReturn

from cascade.sandbox import harness

_dumps = json.dumps
_REPLY_SLACK = 65536
"""Bytes a reply may carry beyond the output budget (JSON framing, returned values)."""


def serve(limits: harness.SandboxLimits, read_fd: int, write_fd: int) -> NoReturn:
    """Load the untrusted code, then answer test requests until the judge ends the execution."""
    try:
        _serve(limits, read_fd, write_fd)
    finally:
        os._exit(0)


def _serve(limits: harness.SandboxLimits, read_fd: int, write_fd: int) -> None:
    budget = [limits.max_output_bytes, 0]
    stdout = harness._CappedStream(budget, keep=True)
    sys.stdout, sys.stderr = stdout, harness._CappedStream(budget, keep=False)
    max_reply = limits.max_output_bytes + _REPLY_SLACK
    over = {"err": [harness.OUTPUT_LIMIT, f"more than {limits.max_output_bytes} bytes of output"]}

    def send(reply: dict[str, Any]) -> None:
        if budget[1]:  # even if the program caught the exception: no credit
            reply = over
        data = _dumps(reply).encode() + b"\n"
        if len(data) > max_reply:
            data = _dumps(over).encode() + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view) :]

    requests = os.fdopen(read_fd, "rb")
    job = json.loads(requests.readline())
    try:
        compiled = compile(job["code"], "<solution>", "exec")
    except (SyntaxError, ValueError) as err:
        return send({"err": [harness.PARSE_ERROR, f"{type(err).__name__}: {err}"]})
    function = None
    entry = job.get("entry_point")
    if entry:
        namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
        try:
            exec(compiled, namespace)
        except BaseException as err:
            return send({"err": list(harness._classify(err))})
        function = namespace.get(entry)
        if not callable(function):
            return send({"err": [harness.PARSE_ERROR, f"no function {entry!r} defined"]})
    send({"loaded": True})
    for line in requests:
        request = json.loads(line)
        try:
            if "stdin" in request:
                reply: dict[str, Any] = {"stdout": harness._run_as_script(compiled, request["stdin"], stdout)}
            elif function is None:
                reply = {"err": [harness.PARSE_ERROR, "function-call test but no entry point"]}
            else:
                reply = _value_reply(function(*request["args"]))
        except BaseException as err:
            reply = {"err": list(harness._classify(err))}
        send(reply)


def _value_reply(value: Any) -> dict[str, Any]:
    """The returned value as JSON text the judge parses and compares; anything that is not plain
    JSON data (an object with its own `__eq__`, a set, a function) is a wrong answer."""
    try:
        return {"value": json.loads(_dumps(value))}
    except BaseException:
        kind = type(value).__name__
        return {"err": [harness.WRONG_ANSWER, f"returned an unserialisable {kind}"]}

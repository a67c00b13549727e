"""The sandbox harness: a warm interpreter that forks one limited child per program.

Run as `python -I -S harness.py` by `cascade.sandbox.jobs.run_jobs` (the `process` backend),
which writes
`{"limits": ..., "workers": n, "workdir": dir, "jobs": [...]}` to its stdin; it prints one JSON line per
finished job (`{"i", "status", "passed", "passed_tests", "total", "detail", "seconds"}`), in
completion order.
Stdlib only (it runs without site-packages and without the `cascade` package on its path). The
bubblewrap workers import it too (`cascade.sandbox.harness`): its limits, reasons and comparisons.

Per job, at most `workers` at a time, the harness forks a child that: starts a new session;
points fds 0-2 at /dev/null; sets RLIMIT_CORE/CPU/FSIZE/NOFILE/NPROC/AS; chdirs into a fresh
temporary directory (removed afterwards); when the harness runs as root, drops to a throwaway
uid (RLIMIT_NPROC, which root ignores, then holds, and `kill(-1)` from that uid reaps every
process the program left, even outside its process group); execs the code; runs the tests with
`sys.stdout`/`sys.stderr` capped; and reports over a pipe (`+<n>` per passed test n, then a JSON
line). The harness kills the child's process group at the wall-clock limit and maps what
happened to a reason:

- `timeout`: the wall-clock budget, `time_limit_s` for loading the program and all its tests
  together (passes so far are kept), or RLIMIT_CPU (SIGXCPU);
- `memory_limit`: MemoryError under RLIMIT_AS, or death near the limit (ru_maxrss);
- `output_limit`: more than `max_output_bytes` written to stdout+stderr (voids all passes);
- `parse_error`: SyntaxError, or no callable entry point after running the module;
- `runtime_error`: an exception, a non-zero SystemExit, an exit or signal before reporting;
- `wrong_answer`: a test's result differs (JSON-normalised, then `_same_value`: ints exactly,
  floats with rel. tol. 1e-6, bools only as bools).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

# Reasons (the same strings as cascade.domains.base; this file cannot import the package).
OK = "ok"
WRONG_ANSWER = "wrong_answer"
PARSE_ERROR = "parse_error"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
RUNTIME_ERROR = "runtime_error"
OUTPUT_LIMIT = "output_limit"
INFRA_ERROR = "infra_error"

_DETAIL_CHARS = 300
_UID_RANGE = (1_000_000, 2_000_000_000)
"""Throwaway uids for sandboxed children (no passwd entry needed)."""


@dataclass(frozen=True)
class SandboxLimits:
    time_limit_s: float = 2.0
    """One wall-clock budget per execution: loading the program and running all its tests (both
    backends). RLIMIT_CPU is the same budget rounded up, plus one second."""
    memory_mb: int = 256
    """RLIMIT_AS of the child (total address space; a bare interpreter uses ~15 MB)."""
    max_output_bytes: int = 65536
    """Bytes the program may write to stdout + stderr."""
    max_processes: int = 16
    """RLIMIT_NPROC (effective only for non-root uids: the harness drops root for the child)."""
    max_file_bytes: int = 1 << 20
    """RLIMIT_FSIZE: largest file the program may write."""
    max_open_files: int = 64


def cpu_seconds(limits: SandboxLimits) -> int:
    """RLIMIT_CPU of a program: its wall-clock budget rounded up, plus one second."""
    return math.ceil(limits.time_limit_s) + 1


_CONTROL_CHARS = dict.fromkeys([*range(0, 9), *range(11, 32), *range(127, 160)])


def clean_text(value: object, max_chars: int = _DETAIL_CHARS) -> str:
    """Text that is always encodable: lone surrogates replaced, control characters but tab
    and newline removed, at most `max_chars` characters (a detail may quote program output)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        text = f"<unprintable {type(value).__name__}>"
    text = text[: max_chars * 2].encode("utf-8", "replace").decode("utf-8").translate(_CONTROL_CHARS)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def kill_group(pid: int) -> None:
    """SIGKILL a process group and its leader (either may be gone already)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


@dataclass
class _Running:
    index: int
    pid: int
    fd: int
    tmpdir: str
    uid: int | None
    total: int
    started: float
    deadline: float
    buffer: bytes = b""
    passed: list[int] = field(default_factory=list)
    final: dict[str, Any] | None = None
    eof: bool = False
    timed_out: bool = False


def _harness_main() -> int:
    global _PRCTL
    with contextlib.suppress(Exception):  # loaded once here, not in every child
        import ctypes

        _PRCTL = ctypes.CDLL(None).prctl
    # The programs must not see the scorer's environment (tokens, paths); children inherit this one.
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    request = json.loads(sys.stdin.buffer.read())
    limits = SandboxLimits(**request["limits"])
    jobs: list[dict[str, Any]] = request["jobs"]
    workers = max(1, int(request.get("workers", 2)))
    workdir = request.get("workdir") or tempfile.gettempdir()
    uid_base = throwaway_uid_base() if os.geteuid() == 0 else None
    pending = list(range(len(jobs)))[::-1]
    running: dict[int, _Running] = {}
    while pending or running:
        while pending and len(running) < workers:
            index = pending.pop()
            uid = None if uid_base is None else uid_base + index
            job = _start_child(index, jobs[index], limits, uid, workdir)
            running[job.fd] = job
        now = time.monotonic()
        wait = max(0.0, min(job.deadline for job in running.values()) - now)
        readable, _, _ = select.select(list(running), [], [], wait)
        for fd in readable:
            job = running[fd]
            _read_reports(job)
            if job.final is not None or job.eof:
                del running[fd]
                _emit(_finish(job, limits))
        now = time.monotonic()
        for fd, job in list(running.items()):
            if now >= job.deadline:
                job.timed_out = True
                del running[fd]
                _emit(_finish(job, limits))
    return 0


def throwaway_uid_base() -> int | None:
    """A random uid range for this harness's children, if dropping root to it works here."""
    base = _UID_RANGE[0] + int.from_bytes(os.urandom(4), "big") % (_UID_RANGE[1] - _UID_RANGE[0])
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(base)
            os.setuid(base)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return base if os.waitstatus_to_exitcode(status) == 0 else None


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _start_child(
    index: int, job: dict[str, Any], limits: SandboxLimits, uid: int | None, workdir: str
) -> _Running:
    tmpdir = tempfile.mkdtemp(prefix=f"job{index}-", dir=workdir)
    if uid is not None:
        os.chown(tmpdir, uid, uid)
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read_fd)
        _child_main(job, limits, write_fd, tmpdir, uid)
    os.close(write_fd)
    return _Running(
        index=index,
        pid=pid,
        fd=read_fd,
        tmpdir=tmpdir,
        uid=uid,
        total=len(job["tests"]),
        started=started,
        deadline=started + limits.time_limit_s,
    )


def _read_reports(job: _Running) -> None:
    try:
        chunk = os.read(job.fd, 65536)
    except OSError:
        chunk = b""
    if not chunk:
        job.eof = True
        return
    job.buffer += chunk
    *lines, job.buffer = job.buffer.split(b"\n")
    for line in lines:
        if line.startswith(b"+") and line[1:].isdigit():
            job.passed.append(int(line[1:]))
        elif line and job.final is None:
            with contextlib.suppress(ValueError, RecursionError):
                final = json.loads(line)
                job.final = final if isinstance(final, dict) else None
    if len(job.buffer) > 65536:  # a program writing junk into our pipe
        job.eof = True


def _finish(job: _Running, limits: SandboxLimits) -> dict[str, Any]:
    kill_group(job.pid)
    _, status, usage = os.wait4(job.pid, 0)
    if job.uid is not None:
        _kill_uid(job.uid)
    while not job.eof and job.final is None and select.select([job.fd], [], [], 0)[0]:
        _read_reports(job)  # passes reported just before a kill still count
    os.close(job.fd)
    shutil.rmtree(job.tmpdir, ignore_errors=True)
    seconds = time.monotonic() - job.started
    record: dict[str, Any] = {"i": job.index, "total": job.total, "seconds": round(seconds, 4)}
    final = job.final
    if final is not None:
        passed = passed_indices(final.get("passed_tests"), job.total)
        record.update(
            status=clean_text(final.get("status", RUNTIME_ERROR), 64),
            passed=len(passed),
            passed_tests=passed,
            detail=clean_text(final.get("detail", "")),
        )
        return record
    passed = passed_indices(job.passed, job.total)
    record.update(passed=len(passed), passed_tests=passed)
    near_memory_limit = usage.ru_maxrss * 1024 >= 0.9 * limits.memory_mb * 2**20
    if job.timed_out:
        record.update(status=TIMEOUT, detail=f"killed after {limits.time_limit_s:g}s wall clock")
    elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        record.update(status=TIMEOUT, detail="CPU time limit")
    elif near_memory_limit:
        record.update(status=MEMORY_LIMIT, detail=f"died near the {limits.memory_mb} MB limit")
    elif os.WIFSIGNALED(status):
        record.update(status=RUNTIME_ERROR, detail=f"killed by signal {os.WTERMSIG(status)}")
    else:
        code = os.waitstatus_to_exitcode(status)
        record.update(status=RUNTIME_ERROR, detail=f"exited with code {code} before finishing its tests")
    return record


def passed_indices(value: Any, total: int) -> list[int]:
    """Distinct test indices in 0..total-1 from a reported list (anything else reads as none)."""
    if not isinstance(value, list):
        return []
    return sorted({n for n in value if type(n) is int and 0 <= n < total})


def _kill_uid(uid: int) -> None:
    """Kill every process of `uid` (including ones that left the process group) from a child.

    `kill(-1)` signals every process the caller may signal (for a plain uid: its own), atomically
    with respect to fork (a forking process with a pending SIGKILL fails its fork).
    """
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except BaseException:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


# --------------------------------------------------------------------------- the child


class _OutputLimitExceeded(BaseException):
    """Raised by a write past the output budget (BaseException: `except Exception` won't hide it)."""


class _CappedStream(io.TextIOBase):
    def __init__(self, budget: list[int], keep: bool) -> None:
        self._budget = budget  # [bytes left, exceeded flag]
        self._keep = keep
        self._parts: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._budget[0] -= len(s.encode("utf-8", "replace"))
        if self._budget[0] < 0:
            self._budget[1] = 1
            raise _OutputLimitExceeded()
        if self._keep:
            self._parts.append(s)
        return len(s)

    def take(self) -> str:
        text = "".join(self._parts)
        self._parts.clear()
        return text


def _child_main(
    job: dict[str, Any], limits: SandboxLimits, report_fd: int, tmpdir: str, uid: int | None
) -> None:
    """Set up the limits, run the tests, report over `report_fd`, exit. Runs in the forked child."""
    code = 0
    parent = os.getppid()
    try:
        detach(report_fd)
        os.chdir(tmpdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = tmpdir
        cpu = cpu_seconds(limits)
        apply_limits(limits, report_fd, cpu)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _die_with_parent(parent)
        _run_tests(job, limits, report_fd)
    except BaseException:
        code = 70
    finally:
        os._exit(code)


_PRCTL: Any = None


def detach(keep_fd: int) -> None:
    """New session; fds 0-2 on /dev/null; every other fd but `keep_fd` closed."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, 1 << 16)


def apply_limits(limits: SandboxLimits, highest_fd: int, cpu_seconds: int) -> None:
    """The program's rlimits (CPU gets a hard limit one second above, so SIGXCPU comes first)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes fail with EFBIG instead
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    for which, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_FSIZE, limits.max_file_bytes),
        (resource.RLIMIT_NOFILE, max(limits.max_open_files, highest_fd + 1)),
        (resource.RLIMIT_NPROC, limits.max_processes),
        (resource.RLIMIT_AS, limits.memory_mb * 2**20),
    ):
        resource.setrlimit(which, (value, value + 1 if which == resource.RLIMIT_CPU else value))


def _die_with_parent(parent: int) -> None:
    """SIGKILL this child if the harness dies (PR_SET_PDEATHSIG; a uid change clears it, so call after)."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGKILL))
    if os.getppid() != parent:
        raise RuntimeError("harness already gone")


def _run_tests(job: dict[str, Any], limits: SandboxLimits, report_fd: int) -> None:
    budget = [limits.max_output_bytes, 0]
    stdout, stderr = _CappedStream(budget, keep=True), _CappedStream(budget, keep=False)
    sys.stdout, sys.stderr = stdout, stderr
    tests: list[dict[str, Any]] = job["tests"]
    passed: list[int] = []

    def report(status: str, detail: str = "") -> None:
        if budget[1]:  # even if the program caught the exception: no credit
            status, detail = OUTPUT_LIMIT, f"more than {limits.max_output_bytes} bytes of output"
            passed.clear()
        line = json.dumps({"status": status, "passed_tests": passed, "detail": detail[:_DETAIL_CHARS]})
        os.write(report_fd, line.encode() + b"\n")

    try:
        compiled = compile(job["code"], "<solution>", "exec")
    except (SyntaxError, ValueError) as err:
        return report(PARSE_ERROR, f"{type(err).__name__}: {err}")
    entry = job.get("entry_point")
    function = None
    if entry:
        namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
        try:
            exec(compiled, namespace)
        except BaseException as err:
            return report(*_classify(err))
        function = namespace.get(entry)
        if not callable(function):
            return report(PARSE_ERROR, f"no function {entry!r} defined")
    first_failure: tuple[str, str] | None = None
    for number, test in enumerate(tests):
        try:
            if "stdin" in test:
                got: Any = _run_as_script(compiled, str(test["stdin"]), stdout)
                ok = _same_stdout(got, str(test.get("stdout", "")))
                expected, shown = test.get("stdout", ""), "stdout"
            elif function is None:
                return report(INFRA_ERROR, "function-call test but the job has no entry_point")
            else:
                args = test["args"] if "args" in test else [test["input"]]
                got = function(*args)
                ok = _same_value(got, test["output"])
                expected, shown = test["output"], f"{entry}({', '.join(map(repr, args))})"[:80]
        except BaseException as err:
            failure = _classify(err)
        else:
            if ok:
                passed.append(number)
                os.write(report_fd, f"+{number}\n".encode())
                continue
            failure = (WRONG_ANSWER, f"test {number}: {shown} = {_short(got)}, expected {_short(expected)}")
        first_failure = first_failure or failure
        if job.get("stop_on_failure", True) or failure[0] != WRONG_ANSWER:
            break
    report(*(first_failure or (OK, "")))


def _run_as_script(compiled: Any, stdin: str, stdout: _CappedStream) -> str:
    sys.stdin = io.StringIO(stdin)
    stdout.take()
    try:
        exec(compiled, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as done:
        if done.code not in (None, 0):
            raise
    return stdout.take()


def _classify(err: BaseException) -> tuple[str, str]:
    if isinstance(err, _OutputLimitExceeded):
        return OUTPUT_LIMIT, "output limit"
    if isinstance(err, MemoryError):
        return MEMORY_LIMIT, "MemoryError"
    try:
        text = f"{type(err).__name__}: {err}"
    except BaseException:
        text = type(err).__name__
    return RUNTIME_ERROR, text


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except BaseException:
        text = "<unprintable>"
    return text if len(text) <= 60 else text[:57] + "..."


def _normalise(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _same_value(got: Any, expected: Any) -> bool:
    """Whether a returned value (made plain JSON data first) is the expected one.

    The rules, the same for both backends and at any depth of lists and dicts:
    - a bool equals only the same bool (True is not 1, 1 is not True);
    - an int expectation is met exactly: by the same int, or by a float of exactly that value
      (3.0 for 3, as Python's `==` says); never by a float merely close to it;
    - a float expectation is met by an int or float within 1e-6 relative (1e-9 absolute);
      infinities only by the same infinity, NaN only by NaN;
    - str and None exactly; lists by length and item by item; dicts by keys and value by value.
    """
    try:
        return _equal(_normalise(got), expected)
    except BaseException:  # RecursionError on nesting, anything else a hostile value raises
        return False


def _equal(got: Any, expected: Any) -> bool:
    """`_same_value` on plain JSON data (recursion bounded by `expected`'s depth)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is bool and type(expected) is bool and got is expected
    if isinstance(expected, int):
        return type(got) in (int, float) and got == expected
    if isinstance(expected, float):
        if type(got) not in (int, float):
            return False
        if math.isnan(expected) or (isinstance(got, float) and math.isnan(got)):
            return isinstance(got, float) and math.isnan(got) and math.isnan(expected)
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(expected, list):
        return (
            type(got) is list
            and len(got) == len(expected)
            and all(_equal(g, e) for g, e in zip(got, expected, strict=True))
        )
    if isinstance(expected, dict):
        return (
            type(got) is dict
            and got.keys() == expected.keys()
            and all(_equal(got[key], value) for key, value in expected.items())
        )
    return type(got) is type(expected) and bool(got == expected)


def _same_stdout(got: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(got) == lines(expected)


if __name__ == "__main__":
    sys.exit(_harness_main())

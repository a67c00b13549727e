"""The plain-process backend (no bubblewrap): limits map to reasons, nothing outlives an
execution, harness failures are infra."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cascade.domains.base as base
from cascade.sandbox import harness as sandbox_harness
from cascade.sandbox import jobs as sandbox
from cascade.sandbox.jobs import ExecResult, Job, SandboxLimits, run_jobs
from cascade.sandbox.pool import (
    HARNESS_FILES,
    LOCK_NAME,
    BwrapSettings,
    lock_staged,
    remove_stale_staged,
    stage_harness,
)

LIMITS = SandboxLimits(time_limit_s=0.5, memory_mb=256, max_output_bytes=4096, max_processes=8)
TESTS = [{"input": x, "output": x + 1} for x in range(3)]


def run_one(code: str, limits: SandboxLimits = LIMITS, tests: list | None = None) -> ExecResult:
    return run_jobs([Job(code, tests if tests is not None else TESTS, "f")], limits, backend="process")[0]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_dead(pids: list[int], seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the sandboxed programs (maybe a throwaway uid) can reach and write to."""
    path = Path(tempfile.mkdtemp(prefix="cascade-sbx-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _nproc_enforced() -> bool:
    """RLIMIT_NPROC holds unless we are root and cannot drop to a throwaway uid."""
    return os.geteuid() != 0 or sandbox_harness.throwaway_uid_base() is not None


def test_reasons_match_base() -> None:
    for name in (
        "OK",
        "WRONG_ANSWER",
        "PARSE_ERROR",
        "TIMEOUT",
        "MEMORY_LIMIT",
        "RUNTIME_ERROR",
        "OUTPUT_LIMIT",
        "INFRA_ERROR",
    ):
        assert getattr(sandbox, name) == getattr(base, name)


def test_passing_and_wrong_programs() -> None:
    ok = run_one("def f(x):\n    return x + 1")
    assert (ok.status, ok.passed, ok.total) == ("ok", 3, 3)
    wrong = run_one("def f(x):\n    return x")
    assert (wrong.status, wrong.passed) == ("wrong_answer", 0)
    assert "f(0) = 0, expected 1" in wrong.detail


LIMIT_CASES: list[tuple[str, str]] = [
    ("def f(x):\n    while True:\n        pass", "timeout"),
    ("import time\ndef f(x):\n    time.sleep(30)", "timeout"),
    ("def f(x):\n    blob = [0] * 10**9\n    return x + 1", "memory_limit"),
    ("def f(x):\n    chunks = []\n    while True:\n        chunks.append(bytearray(10**7))", "memory_limit"),
    ("def f(x):\n    while True:\n        print('spam' * 100)", "output_limit"),
    ("import sys\ndef f(x):\n    sys.stderr.write('e' * 10**5)\n    return x + 1", "output_limit"),
    (
        "def f(x):\n    try:\n        print('x' * 10**5)\n    except BaseException:\n        pass\n"
        "    return x + 1",
        "output_limit",
    ),
    ("def f(x)\n    return x", "parse_error"),
    ("def g(x):\n    return x + 1", "parse_error"),
    ("f = 3", "parse_error"),
    ("def f(x):\n    raise ValueError('boom')", "runtime_error"),
    ("raise SystemExit(3)", "runtime_error"),
    ("import os\ndef f(x):\n    os._exit(0)", "runtime_error"),
    ("def f(x):\n    return f(x)", "runtime_error"),
    ("def f(x):\n    open('big', 'w').write('x' * 10**7)\n    return x + 1", "runtime_error"),
]


@pytest.fixture(scope="module")
def limit_results() -> dict[str, ExecResult]:
    """All the limit cases in one harness (as a score_batch would run them)."""
    start = time.monotonic()
    results = run_jobs([Job(code, TESTS, "f") for code, _ in LIMIT_CASES], LIMITS, backend="process")
    assert time.monotonic() - start < 20
    return {code: result for (code, _), result in zip(LIMIT_CASES, results, strict=True)}


@pytest.mark.parametrize(("code", "status"), LIMIT_CASES)
def test_limits_map_to_reasons(code: str, status: str, limit_results: dict[str, ExecResult]) -> None:
    result = limit_results[code]
    assert result.status == status, result
    assert result.passed == 0  # output_limit voids the passes of a program that caught the error


def test_small_output_is_fine_and_stdin_tests_work() -> None:
    assert run_one("def f(x):\n    print('hi', x)\n    return x + 1").status == "ok"
    echo = "n = int(input())\nprint(n * 2)\nprint('done')"
    tests = [{"stdin": "3\n", "stdout": "6\ndone"}, {"stdin": "5", "stdout": "10\ndone\n"}]
    result = run_jobs([Job(echo, tests)], LIMITS, backend="process")[0]
    assert (result.status, result.passed) == ("ok", 2)
    bad = run_jobs([Job(echo, [{"stdin": "3", "stdout": "7\ndone"}])], LIMITS, backend="process")[0]
    assert bad.status == "wrong_answer"


def test_stop_on_failure_and_pass_count() -> None:
    code = "def f(x):\n    return x + 1 if x != 1 else 0"
    stop = run_jobs([Job(code, TESTS, "f", stop_on_failure=True)], LIMITS, backend="process")[0]
    go_on = run_jobs([Job(code, TESTS, "f", stop_on_failure=False)], LIMITS, backend="process")[0]
    assert (stop.status, stop.passed) == ("wrong_answer", 1)
    assert (go_on.status, go_on.passed) == ("wrong_answer", 2)
    slow = "def f(x):\n    if x == 2:\n        while True:\n            pass\n    return x + 1"
    timed = run_jobs([Job(slow, TESTS, "f", stop_on_failure=False)], LIMITS, backend="process")[0]
    assert (timed.status, timed.passed) == ("timeout", 2)  # passes so far are kept


def test_file_written_by_one_execution_is_not_seen_by_the_next(shared_dir: Path) -> None:
    log = shared_dir / "cwd.txt"
    writer = (
        "import os\n"
        f"open({str(log)!r}, 'a').write(os.getcwd() + '\\n')\n"
        "open('left.txt', 'w').write('secret')\n"
        "def f(x):\n    return x + 1"
    )
    reader = "import os\ndef f(x):\n    return x + 1 if not os.path.exists('left.txt') else -1"
    results = run_jobs(
        [Job(writer, TESTS, "f"), Job(reader, TESTS, "f")], LIMITS, workers=1, backend="process"
    )
    assert [r.status for r in results] == ["ok", "ok"]
    cwd = log.read_text().strip()
    assert cwd and cwd != os.getcwd()
    assert not Path(cwd).exists()  # the fresh temp dir was removed


def test_identical_jobs_run_once(shared_dir: Path) -> None:
    log = shared_dir / "runs.txt"
    log.touch()
    log.chmod(0o666)  # each job may run as its own throwaway uid
    code = f"open({str(log)!r}, 'a').write('run\\n')\ndef f(x):\n    return x + 1"
    results = run_jobs(
        [Job(code, TESTS, "f")] * 3 + [Job(code + "\n", TESTS, "f")], LIMITS, backend="process"
    )
    assert [r.status for r in results] == ["ok"] * 4
    assert log.read_text().count("run") == 2


def test_fork_loop_is_stopped_and_leaves_no_process(shared_dir: Path) -> None:
    if not _nproc_enforced():
        pytest.skip("root without a throwaway uid: RLIMIT_NPROC would not hold")
    log = shared_dir / "pids.txt"
    log.touch()
    log.chmod(0o666)
    code = (
        "import os, time\n"
        "def f(x):\n"
        "    while True:\n"
        "        try:\n"
        "            pid = os.fork()\n"
        "        except OSError:\n"
        "            continue\n"
        "        if pid == 0:\n"
        f"            open({str(log)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "            time.sleep(60)\n"
    )
    limits = SandboxLimits(time_limit_s=0.5, max_processes=8)
    result = run_one(code, limits)
    assert result.status == "timeout"
    pids = [int(line) for line in log.read_text().split()]
    assert 1 <= len(pids) <= 8  # RLIMIT_NPROC stopped the loop
    assert _wait_dead(pids) == []


def test_process_that_leaves_the_group_is_reaped(shared_dir: Path) -> None:
    log = shared_dir / "escaped.txt"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open({str(log)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "time.sleep(0.3)\n"
        "def f(x):\n    return x + 1"
    )
    result = run_one(code)
    assert result.status == "ok"
    pid = int(log.read_text())
    if os.geteuid() != 0 or sandbox_harness.throwaway_uid_base() is None:
        os.kill(pid, signal.SIGKILL)  # documented gap without root: setsid() escapes killpg
        pytest.skip("only the root harness (throwaway uid + kill(-1)) reaps escaped processes")
    assert _wait_dead([pid]) == []


def test_real_fork_bomb_is_contained() -> None:
    if not _nproc_enforced():
        pytest.skip("root without a throwaway uid: RLIMIT_NPROC would not hold")
    bomb = "import os\ndef f(x):\n    while True:\n        try:\n            os.fork()\n"
    bomb += "        except OSError:\n            pass"
    start = time.monotonic()
    result = run_one(bomb, SandboxLimits(time_limit_s=0.5, max_processes=8))
    assert result.status == "timeout"
    assert time.monotonic() - start < 10


def test_program_does_not_see_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_SECRET_TOKEN", "hunter2")
    code = "import os\ndef f(x):\n    return x + 1 if 'CASCADE_SECRET_TOKEN' not in os.environ else -1"
    assert run_one(code).status == "ok"


def test_harness_that_dies_gives_infra_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.sys, "executable", "/bin/false")
    results = run_jobs([Job("def f(x):\n    return x + 1", TESTS, "f")] * 2, LIMITS, backend="process")
    assert [r.status for r in results] == ["infra_error", "infra_error"]
    assert "exited" in results[0].detail


def test_harness_overall_timeout_gives_infra_error_only_for_unfinished_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(sandbox.tempfile, "mkdtemp", recording_mkdtemp)
    jobs = [
        Job("def f(x):\n    return x + 1", TESTS, "f"),
        Job("import time\ndef f(x):\n    time.sleep(30)", TESTS, "f"),
    ]
    start = time.monotonic()
    results = run_jobs(
        jobs, SandboxLimits(time_limit_s=20.0), workers=1, overall_timeout_s=1.0, backend="process"
    )
    assert time.monotonic() - start < 10
    assert [r.status for r in results] == ["ok", "infra_error"]
    assert "exceeded" in results[1].detail
    assert len(made) == 1 and not Path(made[0]).exists()  # the killed harness's job dirs are gone


def test_one_budget_covers_all_tests() -> None:
    """`time_limit_s` bounds loading and all tests together, not each test."""
    code = "import time\ndef f(x):\n    time.sleep(0.3)\n    return x + 1"
    start = time.monotonic()
    result = run_one(code)  # 3 tests x 0.3 s > 0.5 s
    assert (result.status, result.passed) == ("timeout", 1)
    assert time.monotonic() - start < 3


def test_auto_never_falls_back_to_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(*_: Any) -> None:
        raise sandbox.SandboxUnavailable("bubblewrap not found")

    monkeypatch.setattr(sandbox, "shared_pool", unavailable)
    for backend in ("auto", "bwrap"):
        with pytest.raises(sandbox.SandboxUnavailable, match="sandbox: process") as err:
            run_jobs([Job("def f(x):\n    return x + 1", TESTS, "f")], LIMITS, backend=backend)  # type: ignore[arg-type]
        assert "refuses to run without the bubblewrap sandbox" in str(err.value)


def test_process_backend_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox, "_warned_process", False)
    with caplog.at_level("WARNING", logger=sandbox.log.name):
        for _ in range(2):
            assert sandbox.resolve_backend("process") == "process"
    warnings = [r for r in caplog.records if "NOT a security boundary" in r.getMessage()]
    assert len(warnings) == 1


def test_details_are_always_encodable() -> None:
    code = "def f(x):\n    raise ValueError('\\ud800 \\x1b[2J\\x00' * 500)"
    detail = run_one(code).detail
    detail.encode("utf-8")
    assert "\x1b" not in detail and "\x00" not in detail and len(detail) <= 300


# --------------------------------------------------------------------------- the seccomp filter


def _run_filter(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """A classic-BPF interpreter for the instructions the filter uses, over one seccomp_data."""
    import struct

    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x06:  # ret k
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_filter_denies_the_dangerous_syscalls(machine: str) -> None:
    from cascade.sandbox import syscall_filter as sf

    arch, numbers = sf._TABLES[machine]
    program = sf.build(machine)
    eperm, enosys = sf.SECCOMP_RET_ERRNO | 1, sf.SECCOMP_RET_ERRNO | 38
    for name in sf.DENIED:
        if name in numbers:
            assert _run_filter(program, arch, numbers[name]) == eperm, name
    for name in ("io_uring_setup", "keyctl", "bpf", "perf_event_open", "userfaultfd", "ptrace", "unshare"):
        assert name in numbers
    clone = numbers["clone"]
    assert _run_filter(program, arch, clone, 17) == sf.SECCOMP_RET_ALLOW  # fork
    assert _run_filter(program, arch, clone, 0x3D0F00) == sf.SECCOMP_RET_ALLOW  # a thread
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000, 0x08000000, 0x04000000, 0x02000000):
        assert _run_filter(program, arch, clone, flag | 17) == eperm, hex(flag)
    assert _run_filter(program, arch, numbers["clone3"]) == enosys
    assert _run_filter(program, arch, 0) == sf.SECCOMP_RET_ALLOW  # read / io_setup
    assert _run_filter(program, 0x40000003, 0) == sf.SECCOMP_RET_KILL_PROCESS  # i386 compat
    if machine == "x86_64":
        assert _run_filter(program, arch, 0x40000000 | 1) == sf.SECCOMP_RET_KILL_PROCESS  # x32


def test_seccomp_filter_loads_and_denies_in_a_child() -> None:
    from cascade.sandbox import syscall_filter as sf

    if sf.supported() is not None:
        pytest.skip(str(sf.supported()))
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        import ctypes

        code = 1
        try:
            sf.install()
            libc = ctypes.CDLL(None, use_errno=True)
            keyctl = sf._TABLES[os.uname().machine][1]["keyctl"]
            denied = libc.syscall(keyctl, 0, -1, 0) < 0 and ctypes.get_errno() == 1
            child = os.fork()  # plain fork is allowed
            if child == 0:
                os._exit(0)
            os.waitpid(child, 0)
            os.write(write_fd, b"1" if denied else b"0")
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    assert os.read(read_fd, 1) == b"1" and os.waitstatus_to_exitcode(status) == 0
    os.close(read_fd)


def test_passed_tests_name_the_tests_passed() -> None:
    """Which tests passed, not only how many (pass_fraction pays for the hidden ones only)."""
    code = "def f(x):\n    return x + 1 if x != 1 else 0"
    result = run_jobs([Job(code, TESTS, "f", stop_on_failure=False)], LIMITS, backend="process")[0]
    assert (result.status, result.passed, result.passed_tests) == ("wrong_answer", 2, (0, 2))
    slow = "def f(x):\n    while x == 2:\n        pass\n    return x + 1"
    timed = run_jobs([Job(slow, TESTS, "f", stop_on_failure=False)], LIMITS, backend="process")[0]
    assert (timed.status, timed.passed_tests) == ("timeout", (0, 1))  # reported before the kill


def test_int_expectations_compare_exactly() -> None:
    tests = [{"input": 1, "output": 123456789}]
    close = run_one("def f(x):\n    return 123456789.0 + 89", tests=tests)
    assert close.status == "wrong_answer"  # within 1e-6 relative, but not that int
    assert run_one("def f(x):\n    return 123456789.0", tests=tests).status == "ok"
    assert run_one("def f(x):\n    return True", tests=[{"input": 1, "output": 1}]).status == "wrong_answer"


def test_worker_modules_import_from_the_staged_copy_alone() -> None:
    """What a bwrap worker imports, without bwrap: the staged files under the system interpreter
    with `-I -S` (no site-packages, no PYTHONPATH) are the whole of `cascade` it loads."""
    staged = stage_harness()
    try:
        assert sorted(str(p.relative_to(staged)) for p in staged.rglob("*.py")) == sorted(HARNESS_FILES)
        assert {oct(p.stat().st_mode & 0o777) for p in staged.rglob("*") if p.is_dir()} == {"0o755"}
        probe = (
            f"import sys; sys.path[:] = [{str(staged)!r}] + [p for p in sys.path if p not in ('', '.')]; "
            "import cascade.sandbox.nsworker, cascade.sandbox.harness; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('cascade'))))"
        )
        python = BwrapSettings().python if Path(BwrapSettings().python).exists() else sys.executable
        out = subprocess.run(
            [python, "-I", "-S", "-B", "-c", probe], capture_output=True, text=True, check=True, env={}
        )
    finally:
        shutil.rmtree(staged)
    in_sandbox = ("execution", "harness", "judge", "nsworker", "runner", "syscall_filter")
    assert set(out.stdout.split()) == {
        "cascade",
        "cascade.sandbox",
        *(f"cascade.sandbox.{m}" for m in in_sandbox),
    }


def test_stale_staged_directories_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    """A directory whose lock can be taken, or without a lock file and with a dead pid in its
    name, is stale; one whose lock is held, or whose pid lives, or with no pid, is kept."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(gone.stdout)
    holder_dir = tmp_path / f"cascade-sandbox-{dead}-held"
    holder_dir.mkdir()
    (holder_dir / LOCK_NAME).touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(60)",
            str(holder_dir / LOCK_NAME),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        unlocked = tmp_path / f"cascade-sandbox-{os.getpid()}-free"  # a live pid, but its lock is free
        unlocked.mkdir()
        (unlocked / LOCK_NAME).touch()
        (unlocked / "cascade").mkdir()
        (unlocked / "cascade" / "__init__.py").touch()
        no_lock_dead, no_lock_alive, no_pid = (
            tmp_path / f"cascade-sandbox-{dead}-old",
            tmp_path / f"cascade-sandbox-{os.getpid()}-staging",
            tmp_path / "cascade-sandbox-k3x9q2ab",
        )
        for directory in (no_lock_dead, no_lock_alive, no_pid):
            directory.mkdir()
        (tmp_path / "unrelated").mkdir()
        removed = remove_stale_staged(tmp_path)
        assert sorted(removed) == sorted([unlocked, no_lock_dead])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [holder_dir.name, no_lock_alive.name, no_pid.name, "unrelated"]
        )
    finally:
        holder.kill()
        holder.wait()
    assert remove_stale_staged(tmp_path) == [holder_dir]  # its holder is gone


def test_staged_directory_is_named_after_its_process_and_locked(tmp_path: Path) -> None:
    staged = stage_harness(tmp_path)
    fd = lock_staged(staged)
    try:
        assert staged.name.startswith(f"cascade-sandbox-{os.getpid()}-")
        assert remove_stale_staged(tmp_path) == []  # held by this process: kept
    finally:
        os.close(fd)
    assert remove_stale_staged(tmp_path) == [staged]

"""The warm worker pool's failure handling and the start-up check."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cascade.sandbox import cgroups, preflight
from cascade.sandbox.pool import LOCK_NAME, BwrapSettings, SandboxPool, SandboxUnavailable

REPO = Path(__file__).resolve().parents[2]

LIMITS = {
    "time_limit_s": 5.0,
    "memory_mb": 256,
    "max_output_bytes": 4096,
    "max_processes": 8,
    "max_file_bytes": 1 << 20,
    "max_open_files": 64,
}
TESTS = [{"input": 1, "output": 2}]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def job(code: str) -> dict:
    return {"code": code, "tests": TESTS, "entry_point": "f", "limits": LIMITS}


def test_missing_bubblewrap_is_named_with_what_a_pod_needs() -> None:
    with pytest.raises(SandboxUnavailable) as err:
        preflight.require(BwrapSettings(bwrap="no-such-bwrap"))
    message = str(err.value)
    assert "FAIL  bubblewrap: 'no-such-bwrap' not on PATH" in message
    assert "seccompProfile" in message and "procMount" in message


def test_python_outside_usr_is_refused() -> None:
    with pytest.raises(SandboxUnavailable, match="must be an executable under /usr"):
        SandboxPool(1, BwrapSettings(python="/nonexistent/python3"))


@needs_bwrap
def test_preflight_passes_here() -> None:
    checks = preflight.require()
    assert [c.name for c in checks if c.required and c.ok][-1] == "run a program"


@needs_bwrap
def test_worker_killed_mid_job_gives_infra_error_and_is_restarted() -> None:
    pool = SandboxPool(1)
    try:
        worker = pool.workers[0]
        assert worker.proc is not None
        victim = worker.proc.pid
        threading.Timer(0.5, lambda: os.kill(victim, signal.SIGKILL)).start()
        start = time.monotonic()
        result = pool.run([job("import time\ndef f(x):\n    time.sleep(3)\n    return x + 1")])[0]
        assert result["status"] == "infra_error", result
        assert "restarted" in result["detail"]
        assert time.monotonic() - start < 5
        assert worker.restarts == 1
        assert pool.run([job("def f(x):\n    return x + 1")])[0]["status"] == "ok"
    finally:
        pool.close()


def test_cli_check_fails_for_a_root_sandbox_uid(capsys: pytest.CaptureFixture[str]) -> None:
    from cascade.cli.main import main

    if os.geteuid() != 0:
        pytest.skip("the uid setting applies only when running as root")
    assert main(["sandbox", "check", "--uid", "0"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  sandbox uid: root: drops to uid 0" in out and "seccompProfile" in out


@needs_bwrap
def test_pool_started_in_a_thread_survives_the_thread() -> None:
    """bwrap's --die-with-parent follows the forking *thread*: workers must not die with it."""
    made: list[SandboxPool] = []
    starter = threading.Thread(target=lambda: made.append(SandboxPool(1)))
    starter.start()
    starter.join()
    pool = made[0]
    try:
        time.sleep(0.3)
        assert pool.workers[0].proc is not None and pool.workers[0].proc.poll() is None
        assert pool.run([job("def f(x):\n    return x + 1")])[0]["status"] == "ok"
        assert pool.workers[0].restarts == 0
    finally:
        pool.close()


@needs_bwrap
def test_an_unbounded_cpu_is_said_loudly(caplog: pytest.LogCaptureFixture) -> None:
    """Without a CPU quota one execution's hogs can make another time out: the preflight and
    the pool say so (here by turning cgroups off; on a host without a writable cpu controller
    the same)."""
    checks = {c.name: c for c in preflight.check(BwrapSettings(use_cgroups=False))}
    assert not checks["cpu bound"].ok and not checks["cpu bound"].required
    assert checks["cpu bound"].detail.startswith("UNBOUNDED") and "reward" in checks["cpu bound"].detail
    assert "warn  cpu bound: UNBOUNDED" in preflight.format_report(list(checks.values()))
    with caplog.at_level("WARNING", logger="cascade.sandbox.pool"):
        pool = SandboxPool(1, BwrapSettings(use_cgroups=False))
    try:
        assert not pool.cpu_bounded()
        assert any("SANDBOX CPU UNBOUNDED" in r.getMessage() for r in caplog.records)
    finally:
        pool.close()
    bounded = SandboxPool(1)
    try:
        assert bounded.cpu_bounded() == (cgroups.available() and cgroups.cpu_available())
    finally:
        bounded.close()


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp dir of the test's own, in the real one (pytest's tmp_path is out of the sandbox
    uid's reach), as the pools' temp dir."""
    tmp = Path(tempfile.mkdtemp(prefix="test-pool-tmp-"))
    tmp.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _staged(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("cascade-sandbox-*"))


@needs_bwrap
def test_a_closed_pool_leaves_no_directory(private_tmp: Path) -> None:
    pool = SandboxPool(1)
    try:
        assert _staged(private_tmp) == [pool.harness_dir.name]
        assert pool.harness_dir.name.startswith(f"cascade-sandbox-{os.getpid()}-")
        assert (pool.harness_dir / LOCK_NAME).is_file()
        assert pool.run([job("def f(x):\n    return x + 1")])[0]["status"] == "ok"
    finally:
        pool.close()
    assert _staged(private_tmp) == []


_CHILD_POOL = """
import sys, tempfile, time
tempfile.tempdir = sys.argv[1]
from cascade.sandbox.pool import shared_pool
shared_pool(1)
print("ready", flush=True)
time.sleep(60)
"""


def _child_with_a_pool(tmp: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_POOL, str(tmp)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


@needs_bwrap
def test_sigterm_removes_the_directory_and_still_kills(private_tmp: Path) -> None:
    child = _child_with_a_pool(private_tmp)
    assert [name.split("-")[2] for name in _staged(private_tmp)] == [str(child.pid)]
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == -signal.SIGTERM
    assert _staged(private_tmp) == []


@needs_bwrap
def test_a_killed_pools_directory_is_removed_by_the_next_pool(private_tmp: Path) -> None:
    """SIGKILL runs nothing: its directory stays until the next pool starts, which removes it
    (its lock is free) and keeps the directory of a pool that is alive."""
    killed, alive = _child_with_a_pool(private_tmp), _child_with_a_pool(private_tmp)
    try:
        killed.kill()
        killed.wait(timeout=10)
        owners = {name.split("-")[2] for name in _staged(private_tmp)}
        assert owners == {str(killed.pid), str(alive.pid)}
        pool = SandboxPool(1)
        try:
            owners = {name.split("-")[2] for name in _staged(private_tmp)}
            assert owners == {str(alive.pid), str(os.getpid())}
        finally:
            pool.close()
    finally:
        alive.kill()
        alive.wait(timeout=10)

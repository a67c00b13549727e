"""`cascade up`'s supervision on real short-lived processes: a death is reported (pid, exit code
or signal, the end of its log) and the process started again with the same arguments, with a
doubling wait and a bound per window; logs are appended with a marker per start."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cascade.up.stack import LocalStack, Proc
from cascade.up.supervisor import GaveUp, RestartBound, Supervisor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _proc(tmp_path: Path, name: str, code: str) -> Proc:
    return Proc(name, [sys.executable, "-c", code], tmp_path / f"{name}.log")


def _dead(proc: Proc, timeout_s: float = 30) -> None:
    assert proc.popen is not None
    proc.popen.wait(timeout=timeout_s)


def _wait_for(check: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _env() -> dict[str, str]:
    return dict(os.environ)


def test_a_process_that_dies_at_every_start_is_restarted_up_to_its_bound(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "worker-1", "import os, sys; print('cannot start', os.getpid()); sys.exit(3)")
    reports: list[str] = []
    clock = Clock()
    sup = Supervisor(
        RestartBound(max_restarts=2, window_s=60),
        restart=lambda p: p.start(_env()),  # type: ignore[attr-defined]
        report=reports.append,
        clock=clock,
    )
    proc.start(_env())
    first_pid = proc.pid
    _dead(proc)
    sup.check([proc])  # first death: restarted at once
    assert f"worker-1 (pid {first_pid}) died: exit code 3" in reports[0]
    assert f"| cannot start {first_pid}" in reports[0]  # the end of its log
    assert reports[1].startswith("restarted worker-1 (pid ") and proc.pid != first_pid
    _dead(proc)
    sup.check([proc])  # second death: restarted after 1 s
    assert reports[-1] == "worker-1: restarting in 1s" and not proc.alive()
    clock.now += 0.5
    sup.check([proc])
    assert reports[-1] == "worker-1: restarting in 1s"
    clock.now += 0.6
    sup.check([proc])
    assert "restart 2 of at most 2" in reports[-1]
    _dead(proc)
    with pytest.raises(GaveUp) as gave_up:
        sup.check([proc])
    assert gave_up.value.name == "worker-1"
    assert "worker-1 died again after 2 restart(s) within 60s" in str(gave_up.value)
    assert "--max-restarts 2" in str(gave_up.value) and "exit code 3" in str(gave_up.value)
    assert sup.restarts["worker-1"] == 2

    text = proc.log_path.read_text()  # appended: three starts, each marked, each one's output kept
    assert text.count("=== cascade up ") == 3 and text.count("cannot start") == 3
    assert "starting worker-1 (restart 2; the previous process: exit code 3) ===" in text
    assert proc.log() == f"cannot start {proc.pid}\n"  # this start's output only


def test_restarts_older_than_the_window_do_not_count(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "celery-0", "raise SystemExit(1)")
    clock = Clock()
    sup = Supervisor(
        RestartBound(max_restarts=1, window_s=10),
        restart=lambda p: p.start(_env()),  # type: ignore[attr-defined]
        report=lambda line: None,
        clock=clock,
    )
    proc.start(_env())
    for _ in range(3):  # one death per 11 s: never two restarts within the window
        _dead(proc)
        sup.check([proc])
        clock.now += 11
    assert sup.restarts["celery-0"] == 3
    _dead(proc)
    clock.now += 1
    sup.check([proc])  # the restart 1 s ago is in the window now, but the bound is 1: restarted
    assert sup.restarts["celery-0"] == 4
    _dead(proc)
    with pytest.raises(GaveUp):
        sup.check([proc])


def test_a_killed_service_is_restarted_with_the_same_arguments(tmp_path: Path) -> None:
    """A SIGKILLed process of a LocalStack: reported with its signal, started again with the same
    argv (its port is in it); a process stopped on purpose is left alone."""
    reports: list[str] = []
    stack = LocalStack(
        config=tmp_path / "c.yaml",
        model=tmp_path,
        run_dir=tmp_path / "run",
        log_dir=tmp_path / "logs",
        supervise=True,
        report=reports.append,
    )
    sleeper = "import time; print('up', flush=True); time.sleep(60)"
    service = Proc(
        "teacher", [sys.executable, "-c", sleeper, "--port", "4711"], tmp_path / "logs" / "t.log", 4711
    )
    other = Proc("worker-0", [sys.executable, "-c", sleeper], tmp_path / "logs" / "w.log")
    stack.procs = {"teacher": service, "worker-0": other}
    try:
        for p in stack.procs.values():
            p.start(stack._env())
        _wait_for(lambda: service.log() == "up\n")
        stack.check()
        assert reports == []
        old = service.pid
        os.kill(old, signal.SIGKILL)
        _dead(service)
        other.stop()
        stack.check()
        assert f"teacher (pid {old}) died: killed by SIGKILL" in reports[0]
        assert service.alive() and service.pid != old and service.argv[-2:] == ["--port", "4711"]
        assert not other.alive() and not any("worker-0" in r for r in reports)
        _wait_for(lambda: service.log() == "up\n")
        assert service.log_path.read_text().count("up\n") == 2
    finally:
        for p in stack.procs.values():
            p.stop()


def test_the_log_tail_reads_only_the_end(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "reward", "print('\\n'.join(str(i) for i in range(100000)))")
    proc.start(_env())
    _dead(proc)
    assert proc.log_tail(3) == "99997\n99998\n99999"
    assert proc.exit_status() == "exit code 0"


def test_restart_bound_errors_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--max-restarts"):
        RestartBound(max_restarts=-1)
    with pytest.raises(ValueError, match="--restart-window-s"):
        RestartBound(window_s=0)
    assert [RestartBound().delay_s(n) for n in range(7)] == [0, 1, 2, 4, 8, 16, 30]

"""`cascade up` supervises what it started, on real processes and the random tiny model.

- A rollout worker and a Celery reward worker (scoring math here) SIGKILLed mid-stage: each is
  reported and started again with the same arguments, and the run completes with contiguous
  steps and no sample trained twice (`LocalStack(supervise=True)`, as `cascade up` runs it).
- `cascade up` itself: a worker that dies at every start passes its restart bound, the stack
  stops with the reason and the resume command; that command, run as printed, continues from the
  checkpoint; its learner SIGKILLed is not restarted, the same command is printed again, and run
  once more it finishes the run. Every log is appended to (earlier output kept, each start marked).
- `cascade up` given Redis and database URLs with a password shows it on no process's command
  line, and SIGKILLed takes every process it started along (issue 34).

Needs Redis on 127.0.0.1:6379 (skipped without it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cascade.runner.checkpoint import latest_checkpoint
from cascade.up.orphans import STATE_FILE, orphan_refusal, proc_stat, record_paths
from cascade.up.stack import LocalStack

REDIS_URL = os.environ.get("CASCADE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except redis.RedisError:
        pytest.skip(f"Redis unreachable at {REDIS_URL}")


def _math_stage(max_steps: int) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
        data["stages"] = data["stages"][1:]  # math
        data["stages"][0].pop("distill")
        data["stages"][0]["advance"]["max_steps"] = max_steps
        data["stages"][0]["eval"] = {"every": 100}
        data["checkpoint"] = {"every": 2, "keep_last": 2}

    return edit


def _trained(run_dir: Path) -> list[list[str]]:
    path = run_dir / "samples.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["sample_ids"] for line in path.read_text().splitlines()]


def _wait(
    what: str, check: Callable[[], Any], timeout_s: float = 180, alive: Callable[[], bool] | None = None
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if alive is not None and not alive():
            raise AssertionError(f"exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s}s")
        time.sleep(0.1)


def _assert_contiguous_once_each(e2e: Any, run_dir: Path, steps: int) -> None:
    rows = e2e.rows(e2e.sqlite_url(run_dir))
    assert rows.run_status == "completed"
    assert [g for _, _, g, _ in rows.steps] == list(range(1, steps + 1))  # contiguous, none twice
    trained = _trained(run_dir)
    assert len(trained) == steps and all(len(step) == 4 * 4 for step in trained)
    everything = [sid for step in trained for sid in step]
    assert [sid for sid, n in Counter(everything).items() if n > 1] == []  # no sample trained twice


def test_killed_worker_and_celery_worker_are_reported_and_restarted(e2e: Any, tmp_path: Path) -> None:
    e2e.config(tmp_path, _math_stage(max_steps=5))
    run_dir = tmp_path / "run"
    reports: list[str] = []
    stack = LocalStack(
        config=tmp_path / "cascade.yaml",
        model=e2e.model_path,
        run_dir=run_dir,
        log_dir=tmp_path / "logs",
        redis_url=REDIS_URL,
        stream_prefix=f"cascade:test-up:{uuid.uuid4().hex[:8]}",
        workers=2,
        celery_workers=1,
        claim_idle_ms=2000,
        supervise=True,
        reward_flags=["--remote-domains", "math", "--task-timeout-s", "120"],
        process_env={
            "CASCADE_REWARD_SANDBOX_CHECK": "0",  # math only: no code to sandbox
            # a task the killed worker had taken goes back to the queue after 5 s
            "CASCADE_REWARD_VISIBILITY_TIMEOUT_S": "5",
            "CASCADE_REWARD_RESTORE_INTERVAL_S": "1",
        },
        report=reports.append,
    )
    try:
        stack.start_services(timeout_s=180)
        for i in range(stack.workers):
            stack.worker(i)
        learner = stack.start_learner()
        celery, worker = stack.procs["celery-0"], stack.procs["worker-0"]
        _wait("step 1", lambda: len(_trained(run_dir)) >= 1, alive=learner.alive)
        assert "succeeded" in celery.log(), celery.log()[-2000:]  # math is scored by Celery here
        killed = {"worker-0": worker.pid, "celery-0": celery.pid}
        for pid in killed.values():
            os.kill(pid, signal.SIGKILL)  # the main process only, as `kill -9 PID` does
        assert stack.wait(timeout_s=300) == 0, learner.log()[-3000:]
        celery_after, worker_log = celery.log(), worker.log_path.read_text()
    finally:
        stack.stop()
    text = "\n".join(reports)
    for name, pid in killed.items():
        assert f"{name} (pid {pid}) died: killed by SIGKILL" in text, text
        assert re.search(rf"restarted {name} \(pid \d+\) with the same arguments \(restart 1 of", text), text
    assert stack.supervisor is not None and dict(stack.supervisor.restarts) == {"worker-0": 1, "celery-0": 1}
    assert "succeeded" in celery_after, celery_after[-2000:]  # the restarted Celery worker scored
    assert (
        worker_log.count("=== cascade up ") == 2
        and "(restart 1; the previous process: killed by SIGKILL)" in worker_log
    )
    _assert_contiguous_once_each(e2e, run_dir, steps=5)


class UpProcess:
    """`cascade up` as an operator runs it, its stdout and stderr in files."""

    def __init__(self, argv: list[str], root: Path, name: str) -> None:
        self.out, self.err = root / f"{name}.out", root / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "cascade.cli", *argv], cwd=REPO, stdout=out, stderr=err
            )

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout_s: float) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.send_signal(signal.SIGTERM)  # stops its stack
            self.popen.wait(timeout=60)
            raise AssertionError(
                f"cascade up still running after {timeout_s}s:\n{self.stderr()[-3000:]}"
            ) from None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_worker_dying_at_every_start_stops_up_with_the_resume_command_that_finishes_the_run(
    e2e: Any, tmp_path: Path
) -> None:
    steps = 8
    e2e.config(tmp_path, _math_stage(max_steps=steps))
    run_dir, log_dir = tmp_path / "run", tmp_path / "logs"
    argv = ["up", str(tmp_path / "cascade.yaml"), "--run-dir", str(run_dir), "--log-dir", str(log_dir)]
    argv += ["--redis-url", REDIS_URL, "--workers", "2", "--celery-workers", "0"]
    argv += ["--max-restarts", "1", "--restart-window-s", "120"]
    first = UpProcess(argv, tmp_path, "first")
    try:
        pids = _wait(
            "the stack", lambda: re.findall(r"^\s+(\S+)\s+pid (\d+)", first.stdout(), re.M), alive=first.alive
        )
        started = {name: int(pid) for name, pid in pids}
        assert set(started) == {"rollout", "reward", "teacher", "worker-0", "worker-1", "learner"}, pids
        _wait("a checkpoint", lambda: latest_checkpoint(run_dir / "checkpoints"), alive=first.alive)
        # worker-1 now dies at every start: killed, restarted once, killed again -> past the bound
        os.kill(started["worker-1"], signal.SIGKILL)
        restarted = _wait(
            "the restart",
            lambda: re.search(r"restarted worker-1 \(pid (\d+)\)", first.stderr()),
            alive=first.alive,
        )
        os.kill(int(restarted.group(1)), signal.SIGKILL)
        assert first.wait(timeout_s=120) == 1
    finally:
        if first.alive():
            first.popen.send_signal(signal.SIGTERM)
            first.popen.wait(timeout=60)
    err = first.stderr()
    assert f"worker-1 (pid {started['worker-1']}) died: killed by SIGKILL" in err, err[-3000:]
    assert (
        "error: worker-1 died again after 1 restart(s) within 120s (bound: --max-restarts 1 per "
        "--restart-window-s 120); last: killed by SIGKILL; stopping the stack"
    ) in err, err[-3000:]
    groups = [*started.values(), int(restarted.group(1))]  # every group stopped
    deadline = time.monotonic() + 20  # killed members are reaped asynchronously after up exits
    while any(_group_alive(pid) for pid in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_group_alive(pid) for pid in groups), [pid for pid in groups if _group_alive(pid)]
    hint = re.search(r"^continue with: (.+)$", err, re.M)
    assert hint is not None, err[-3000:]
    words = shlex.split(hint.group(1))
    assert words[:4] == ["cascade", "up", str(tmp_path / "cascade.yaml"), "--resume"], words
    record = json.loads((run_dir / "run.json").read_text())
    assert record["launch"]["workers"] == 2 and record["launch"]["redis_url"] == REDIS_URL
    for flag in (
        "--redis-url",
        "--stream-prefix",
        "--workers",
        "--celery-workers",
        "--log-dir",
        "--max-restarts",
    ):
        assert flag in words, (flag, words)
    logs_before = {p.name: p.read_bytes() for p in log_dir.glob("*.log")}
    trained_before = len(_trained(run_dir))
    assert 1 <= trained_before < steps

    # the hint as printed; its learner killed: not restarted, the same hint printed again
    resumed = UpProcess(words[1:], tmp_path, "resumed")
    try:
        _wait("a step after the resume", lambda: len(_trained(run_dir)) > trained_before, alive=resumed.alive)
        learner_pid = int(re.findall(r"^\s+learner\s+pid (\d+)", resumed.stdout(), re.M)[-1])
        os.kill(learner_pid, signal.SIGKILL)
        assert resumed.wait(timeout_s=120) == 128 + signal.SIGKILL
    finally:
        if resumed.alive():
            resumed.popen.send_signal(signal.SIGTERM)
            resumed.popen.wait(timeout=60)
    err = resumed.stderr()
    assert f"error: the learner (pid {learner_pid}) ended: killed by SIGKILL" in err, err[-3000:]
    assert "cascade up does not restart it: only --resume continues the run" in err
    assert f"continue with: {hint.group(1)}" in err  # the same command, stable across crashes
    assert "restarted" not in err

    finished = UpProcess(words[1:], tmp_path, "finished")
    assert finished.wait(timeout_s=400) == 0, finished.stderr()[-3000:]
    _assert_contiguous_once_each(e2e, run_dir, steps=steps)
    assert "resumed from step-" in finished.stdout()
    for name, before in logs_before.items():  # appended, never truncated
        after = (log_dir / name).read_bytes()
        assert after.startswith(before) and len(after) > len(before), name
    learner_log = (log_dir / "learner.log").read_text()
    assert learner_log.count("=== cascade up ") == 3 and learner_log.count("resumed from step-") == 2
    worker_log = (log_dir / "worker-1.log").read_text()
    assert worker_log.count("=== cascade up ") == 4  # start, restart 1, one per resumed stack


SECRET = "s3cret-pw-34"


def _with_password(url: str) -> str:
    """`url` with user and password (`SECRET`); the local servers do not check it (Redis without
    a password takes any for its default user, Postgres with trust auth ignores it)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is not None:
        pytest.skip(f"{parts.scheme} URL with a password of its own: {parts.hostname}")
    user = parts.username or "default"
    return urlunsplit(parts._replace(netloc=f"{user}:{SECRET}@{parts.netloc.rsplit('@', 1)[-1]}"))


def _groups(pgids: set[int]) -> dict[int, int]:
    """Every live process of these process groups (pid: start time)."""
    found = {}
    for entry in Path("/proc").iterdir():
        stat = proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat.running and stat.pgrp in pgids:
            found[int(entry.name)] = stat.start
    return found


def _running(pid: int, start: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat.running and stat.start == start


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc and prctl")
def test_up_sigkilled_takes_every_process_along_none_showing_a_password(e2e: Any, tmp_path: Path) -> None:
    from pg_schema import fresh_schema

    e2e.config(tmp_path, _math_stage(max_steps=500))  # still training when `cascade up` is killed
    run_dir, log_dir = tmp_path / "run", tmp_path / "logs"
    redis_url = _with_password(REDIS_URL)
    with fresh_schema("up_secret") as url:
        db_url = _with_password(url)
        argv = ["up", str(tmp_path / "cascade.yaml"), "--run-dir", str(run_dir), "--log-dir", str(log_dir)]
        argv += ["--redis-url", redis_url, "--db", db_url, "--workers", "2", "--celery-workers", "1"]
        up = UpProcess(argv, tmp_path, "up")
        try:
            pids = _wait(
                "the stack", lambda: re.findall(r"^\s+(\S+)\s+pid (\d+)", up.stdout(), re.M), alive=up.alive
            )
            started = {name: int(pid) for name, pid in pids}
            names = {"rollout", "reward", "teacher", "celery-0", "worker-0", "worker-1", "learner"}
            assert set(started) == names, pids
            # each connects: the learner trains (Postgres, Redis), workers feed it (Redis), Celery is up
            _wait("step 1", lambda: len(_trained(run_dir)) >= 1, alive=up.alive)
            celery_log = log_dir / "celery-0.log"
            _wait(
                "the Celery worker",
                lambda: " ready." in celery_log.read_text(errors="replace"),
                alive=up.alive,
            )
            everyone = _groups(set(started.values()))  # theirs too: Celery's pool, ...
            assert set(started.values()) <= set(everyone), (started, everyone)
            for pid in everyone:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                assert SECRET.encode() not in cmdline, (pid, cmdline)
            assert SECRET.encode() in Path(f"/proc/{up.popen.pid}/cmdline").read_bytes()  # as given
            recorded = json.loads((log_dir / STATE_FILE).read_text())
            assert {n: p["pid"] for n, p in recorded["processes"].items()} == started
            assert SECRET not in json.dumps(recorded)

            up.popen.send_signal(signal.SIGKILL)  # no stop, no cleanup: only the kernel's signal
            up.popen.wait(timeout=10)
        finally:
            if up.alive():
                up.popen.send_signal(signal.SIGTERM)
                up.popen.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(_running(pid, start) for pid, start in everyone.items()) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid for pid, start in everyone.items() if _running(pid, start)}
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"still running after cascade up was SIGKILLed: {left}"
    # the learner stopped as on Ctrl-C (its resume hint), and nothing is left for a new `up` to refuse
    assert "learner interrupted; continue with:" in (log_dir / "learner.log").read_text(errors="replace")
    assert orphan_refusal(record_paths(run_dir, log_dir), settle_s=0) is None

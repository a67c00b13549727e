"""The distributed run rides out blips of its services (issue 21, item 2): a Redis restarted
without persistence while the learner waits with requests queued, the teacher service killed and
restarted on its port mid-stage, the rollout replica killed and restarted on its port. Each
during a short run of the tiny model (`cascade.up.stack.LocalStack`; one set of services for the module,
a fresh learner and workers per test): the run completes with contiguous steps, no sample trained
twice, and the outage in the step metrics (`resilience/<dependency>_*`) and in Prometheus.
Needs Redis on 127.0.0.1:6379 for the reward service's broker (skipped without it), and
redis-server for the private, restarted one.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from private_redis import PrivateRedis
from stack_probe import REDIS_URL, redis_up

from cascade.up.stack import LocalStack, Proc, wait_serving


@pytest.fixture(scope="module")
def stack(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    if not redis_up():
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    root = tmp_path_factory.mktemp("blips")
    s = LocalStack(
        config=root / "unset.yaml",
        model=random_tiny_model,
        run_dir=root / "unset",
        log_dir=root / "logs",
        redis_url=REDIS_URL,
        celery_workers=0,  # if / math are scored in the reward front
        claim_idle_ms=60_000,
    )
    try:
        s.start_services(timeout_s=120)
        yield s
    finally:
        s.stop()


def _configure(e2e: Any, stack: LocalStack, tmp_path: Path, stages: int, steps: int, **extra: Any) -> Path:
    def edit(data: dict[str, Any]) -> None:
        data.update(extra)
        data["rollout"] = {"seeding": "per_request", "prompts_per_request": 1}
        data["stages"] = data["stages"][:stages]
        for stage in data["stages"]:
            stage["advance"]["max_steps"] = steps
            stage["eval"] = {"every": steps}
            stage["grpo"]["max_staleness"] = 1  # two batches in flight: requests always queued

    e2e.config(tmp_path, edit)
    stack.config, stack.run_dir, stack.db = tmp_path / "cascade.yaml", tmp_path / "run", None
    stack.stream_prefix = f"cascade:blips:{uuid.uuid4().hex[:8]}"
    return stack.run_dir


def _trained(run_dir: Path) -> list[list[str]]:
    path = run_dir / "samples.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["sample_ids"] for line in path.read_text().splitlines() if line.strip()]


def _wait(what: str, check: Any, proc: Proc, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert proc.alive(), f"{proc.name} exited while waiting for {what}:\n{proc.log()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s}s:\n{proc.log()[-3000:]}"
        time.sleep(0.1)


def _dependency_outages(port: int | None) -> dict[str, float]:
    """`cascade_learner_dependency_outages_total` by dependency, from the learner's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        s.labels["dependency"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "cascade_learner_dependency_outages_total"
    }


def _restart(stack: LocalStack, name: str, down_s: float = 1.0) -> None:
    """SIGKILL a service and start it again with the same arguments on the same port."""
    proc = stack.procs[name]
    proc.signal_group(signal.SIGKILL)
    assert proc.popen is not None
    proc.popen.wait(timeout=10)
    time.sleep(down_s)
    proc.log_path = proc.log_path.with_name(f"{name}-restarted.log")
    proc.start(stack._env(), stack.nice)
    wait_serving(proc, 120)


def _check_run(e2e: Any, run_dir: Path, steps: int, dependency: str) -> list[dict[str, Any]]:
    """Completed, contiguous steps, every sample trained once, the outage in the last step's
    metrics (process totals); the step metrics returned."""
    rows = e2e.rows(e2e.sqlite_url(run_dir))
    assert rows.run_status == "completed"
    assert [g for _, _, g, _ in rows.steps] == list(range(1, steps + 1))
    trained = _trained(run_dir)
    assert len(trained) == steps and all(len(step) == 4 * 4 for step in trained)
    everything = [sid for step in trained for sid in step]
    assert [sid for sid, n in Counter(everything).items() if n > 1] == []
    metrics = [m for _, _, _, m in rows.steps]
    last = metrics[-1]
    assert last[f"resilience/{dependency}_outages"] >= 1, last
    assert last[f"resilience/{dependency}_down_s"] > 0 and last[f"resilience/{dependency}_degraded"] == 0
    return metrics


def test_redis_restarted_without_persistence_while_requests_are_queued(
    stack: LocalStack, e2e: Any, tmp_path: Path
) -> None:
    """The workers are stopped (SIGSTOP) so the learner's requests sit in the stream; Redis is
    killed and started empty on its port; the workers continue. The learner makes the streams
    again and re-issues what was lost; the workers reconnect and serve it."""
    import redis

    server = PrivateRedis(tmp_path / "redis")
    server.start()
    run_dir = _configure(e2e, stack, tmp_path, stages=1, steps=4)
    stack.redis_url = server.url  # the learner and workers; the reward service keeps its broker
    client = redis.Redis.from_url(server.url)
    try:
        workers = [stack.worker(i) for i in range(2)]
        learner = stack.start_learner()
        _wait("step 1", lambda: len(_trained(run_dir)) >= 1, learner)
        for w in workers:
            w.signal_group(signal.SIGSTOP)
        prompts = f"{stack.stream_prefix}:prompts"

        def queued() -> bool:  # taken and not acknowledged, or not taken yet
            groups = client.xinfo_groups(prompts)
            return any(int(g["pending"]) + int(g.get("lag") or 0) > 0 for g in groups)

        _wait("queued requests", queued, learner, timeout_s=60)
        client.close()
        server.restart(down_s=1.0)
        for w in workers:
            w.signal_group(signal.SIGCONT)
        _wait("the learner to see the outage", lambda: "redis back after" in learner.log(), learner)
        outages = _dependency_outages(learner.metrics_port)
        assert stack.wait(timeout_s=180) == 0, learner.log()[-3000:]
        log = learner.log()
        assert all(w.alive() for w in workers), "the workers must survive the restart"
        worker_logs = [w.log() for w in workers]
    finally:
        stack.redis_url = REDIS_URL
        stack.stop_run()
        server.stop()
    assert outages.get("redis", 0) >= 1, outages
    assert log.count("redis unreachable") == 1, log[-3000:]
    assert "re-issued" in log, log[-3000:]
    assert all(text.count("redis unreachable") <= 1 for text in worker_logs)
    metrics = _check_run(e2e, run_dir, 4, "redis")
    assert sum(m["reissued_requests"] for m in metrics) >= 1


def test_teacher_service_killed_and_restarted_mid_stage(stack: LocalStack, e2e: Any, tmp_path: Path) -> None:
    """In stage 2 (distilling from stage 1's teacher) the teacher service is SIGKILLed and started
    again on its port once the learner has seen it gone: the learner retries, registers its
    teachers again with the new process, and completes."""
    run_dir = _configure(e2e, stack, tmp_path, stages=2, steps=3)
    try:
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        _wait("a stage 2 step", lambda: len(_trained(run_dir)) >= 4, learner)
        teacher = stack.procs["teacher"]
        teacher.signal_group(signal.SIGKILL)
        assert teacher.popen is not None
        teacher.popen.wait(timeout=10)
        _wait("the learner to see the teacher gone", lambda: "teacher unreachable" in learner.log(), learner)
        _restart(stack, "teacher", down_s=0.0)
        _wait("the teacher back", lambda: "teacher back after" in learner.log(), learner)
        try:
            outages: dict[str, float] | None = _dependency_outages(learner.metrics_port)
        except (OSError, http.client.HTTPException):
            # The learner finished its last steps first: its metrics server closes before the
            # process exits (so it may still be alive here); the step metrics hold the outage.
            outages = None
        assert stack.wait(timeout_s=180) == 0, learner.log()[-3000:]
        log = learner.log()
    finally:
        stack.stop_run()
    assert outages is None or outages.get("teacher", 0) >= 1, outages
    assert log.count("teacher unreachable") == 1, log[-3000:]
    assert "registered if again" in log, log[-3000:]
    metrics = _check_run(e2e, run_dir, 6, "teacher")
    assert all(any(k.startswith("distill_if_") for k in m) for m in metrics[3:])


def test_rollout_replica_killed_and_restarted_on_its_port(
    stack: LocalStack, e2e: Any, tmp_path: Path
) -> None:
    """The only rollout replica is SIGKILLed after step 1 and started again on its port: every
    replica down is the `rollout` outage; the learner re-admits the new process with the current
    weights before it serves, and the run completes."""
    run_dir = _configure(e2e, stack, tmp_path, stages=1, steps=4)
    try:
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        _wait("step 1", lambda: len(_trained(run_dir)) >= 1, learner)
        _restart(stack, "rollout", down_s=1.0)
        _wait("the replica back", lambda: "answers again" in learner.log(), learner)
        outages = _dependency_outages(learner.metrics_port)
        assert stack.wait(timeout_s=180) == 0, learner.log()[-3000:]
        log = learner.log()
    finally:
        stack.stop_run()
    address = stack.procs["rollout"].address
    assert f"rollout replica {address} answers again" in log, log[-3000:]
    assert outages.get("rollout", 0) >= 1, outages
    metrics = _check_run(e2e, run_dir, 4, "rollout")
    assert metrics[-1]["rollout_replicas"] == 1 and metrics[-1]["replicas_out"] == 0


def test_every_replica_down_past_the_bound_stops_the_run_with_its_resume_command(
    stack: LocalStack, e2e: Any, tmp_path: Path
) -> None:
    """`resilience.rollout_s: 3` and the only replica SIGKILLed for good: the learner stops with
    the reason and the resume command, exit code 75 (EX_TEMPFAIL). Last in the module: the
    rollout service stays dead."""
    run_dir = _configure(e2e, stack, tmp_path, stages=1, steps=6, resilience={"rollout_s": 3})
    try:
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        _wait("step 1", lambda: len(_trained(run_dir)) >= 1, learner)
        rollout = stack.procs["rollout"]
        rollout.signal_group(signal.SIGKILL)
        code = stack.wait(timeout_s=120)
        log = learner.log()
    finally:
        stack.stop_run()
    assert code == 75, log[-3000:]
    stopped = re.search(r"error: learner stopped: rollout unreachable for (\d+)s \(bound reached\)", log)
    assert stopped is not None and 3 <= int(stopped.group(1)) <= 10, log[-3000:]  # probed every 2 s
    assert "continue with:" in log and "--resume" in log.split("continue with:")[-1], log[-3000:]
    assert log.count("rollout unreachable") == 2  # the outage begun, then the stop
    assert "Traceback" not in log, log[-3000:]

"""The distributed mode end to end on local processes: rollout, reward and teacher services,
rollout workers over Redis streams, and the learner writing to Postgres (`cascade.up.LocalStack`).

One set of services serves both tests (started once, stopped by pid at the end); each test
starts its own learner and workers on a fresh stream prefix. Needs Redis on 127.0.0.1:6379
(skipped without it) and Postgres (the `postgres_url` fixture).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cascade.up import LocalStack

REDIS_URL = os.environ.get("CASCADE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DISTRIBUTED_ONLY = {"time_push_s", "time_wait_s", "idle_fraction", "duplicate_chunks"}


def _redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def stack(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    if not _redis_up():
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    root = tmp_path_factory.mktemp("distributed")
    s = LocalStack(
        config=root / "unset.yaml",
        model=random_tiny_model,
        run_dir=root / "unset",
        log_dir=root / "logs",
        redis_url=REDIS_URL,
        celery_workers=0,  # if / math are scored in the reward front; Celery is for code / rlhf
        claim_idle_ms=1000,
    )
    try:
        s.start_services(timeout_s=120)
        yield s
    finally:
        s.stop()


def _use(stack: LocalStack, config: Path, run_dir: Path, db: str | None) -> None:
    stack.config, stack.run_dir, stack.db = config, run_dir, db
    stack.stream_prefix = f"cascade:test:{uuid.uuid4().hex[:8]}"


def _two_stage(data: dict[str, Any]) -> None:
    data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
    for stage in data["stages"]:
        stage["advance"]["max_steps"] = 3


def _scrape_while_training(port: int | None, stack: LocalStack, timeout_s: float = 150) -> dict[str, float]:
    """The learner's /metrics once it has taken a step (it serves them only while training)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and stack.procs["learner"].popen.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                text = reply.read().decode()
        except OSError:
            time.sleep(0.2)
            continue
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        if values.get("cascade_learner_steps_total", 0) >= 1:
            return values
        time.sleep(0.2)
    return {}


def test_two_stage_cascade_with_distillation_matches_embedded(stack, e2e, tmp_path, postgres_url) -> None:
    cfg = e2e.config(tmp_path, _two_stage)
    run_dir = tmp_path / "distributed"
    _use(stack, tmp_path / "cascade.yaml", run_dir, postgres_url)
    stack.claim_idle_ms = 60_000  # no take-overs of slow-but-alive workers here (test below)
    try:
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        scraped = _scrape_while_training(learner.metrics_port, stack)
        assert stack.wait(timeout_s=150) == 0, stack.procs["learner"].log()[-3000:]
        assert scraped.get("cascade_learner_steps_total", 0) >= 1, scraped
        assert 0.0 <= scraped["cascade_learner_idle_fraction"] <= 1.0
        from cascade.transport.teacher_client import TeacherClient

        client = TeacherClient(stack.procs["teacher"].address)
        registered = {t.name: t.checkpoint for t in client.list_teachers().teachers}
        client.close()
    finally:
        stack.stop_run()
    rows = e2e.rows(postgres_url)
    assert rows.run_status == "completed"
    assert [(i, d, st) for i, _, d, st in rows.stages] == [(0, "if", "completed"), (1, "math", "completed")]
    expected = [(0, 1, 1), (0, 2, 2), (0, 3, 3), (1, 1, 4), (1, 2, 5), (1, 3, 6)]
    assert [(s, st, g) for s, st, g, _ in rows.steps] == expected
    for _, _, _, m in rows.steps:
        assert 0.0 <= m["idle_fraction"] <= 1.0 and m["time_wait_s"] >= 0 and m["duplicate_chunks"] == 0
        assert m["staleness"] == 0.0
    assert all(any(k.startswith("distill_if_") for k in m) for m in rows.step_metrics(1))
    assert not any(any(k.startswith("distill_") for k in m) for m in rows.step_metrics(0))
    # the best checkpoint per trained domain is the teacher, in the store and in the teacher service
    teachers = {d: path for d, _, path in rows.teachers}
    assert set(teachers) == {"if", "math"}
    assert Path(registered["if"]).resolve() == Path(teachers["if"]).resolve()

    # same config and seed in one process: the same numbers, step for step (sampling is seeded
    # per request from (seed, batch, request); weights go through float32 safetensors unchanged)
    embedded_dir = tmp_path / "embedded"
    e2e.run(cfg, run_dir=embedded_dir)
    ref = e2e.rows(e2e.sqlite_url(embedded_dir))
    skip = set(e2e.TIMING_KEYS) | DISTRIBUTED_ONLY
    for (_, _, g, dist), (_, _, g2, emb) in zip(rows.steps, ref.steps, strict=True):
        assert g == g2
        assert set(dist) - skip == set(emb) - skip, g
        for key in set(emb) - skip:
            a, b = dist[key], emb[key]
            assert a == b, (g, key, a, b)  # identical: same seeds, same weights, same functions
    assert [e[:5] for e in rows.evals] == [e[:5] for e in ref.evals]


def _trained(run_dir: Path) -> list[list[str]]:
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    return [json.loads(line)["sample_ids"] for line in lines]


def _wait_log(stack: LocalStack, name: str, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in stack.procs[name].log():
        assert stack.procs[name].alive(), stack.procs[name].log()[-2000:]
        assert time.monotonic() < deadline, f"{name}: no {text!r}:\n{stack.procs[name].log()[-2000:]}"
        time.sleep(0.1)


def test_killed_workers_lose_no_sample_and_none_is_trained_twice(stack, e2e, tmp_path) -> None:
    """worker-0 publishes its request's groups and dies before acknowledging (a re-delivery would
    train them twice); worker-1 dies after taking a request, before generating (it would be
    lost). Both are SIGKILLed; worker-2 claims both requests."""

    def one_stage(data: dict[str, Any]) -> None:
        data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
        data["stages"] = data["stages"][:1]
        data["stages"][0]["advance"]["max_steps"] = 3

    e2e.config(tmp_path, one_stage)
    run_dir = tmp_path / "run"
    _use(stack, tmp_path / "cascade.yaml", run_dir, None)
    stack.claim_idle_ms = 1000
    stack.worker_flags = {
        0: ["--fault-hold-s", "600", "--fault-at", "before_ack"],
        1: ["--fault-hold-s", "600", "--fault-at", "before_generate"],
    }
    try:
        stack.worker(0)
        stack.worker(1)
        stack.start_learner()
        _wait_log(stack, "worker-0", "fault hold", 90)
        _wait_log(stack, "worker-1", "fault hold", 30)
        for name in ("worker-0", "worker-1"):
            stack.procs[name].signal_group(signal.SIGKILL)
        stack.worker(2)
        assert stack.wait(timeout_s=90) == 0, stack.procs["learner"].log()[-3000:]
        worker2 = stack.procs["worker-2"].log()
    finally:
        stack.worker_flags = {}
        stack.stop_run()
    assert worker2.count("claimed") >= 2, worker2[-2000:]
    trained = _trained(run_dir)
    assert len(trained) == 3
    everything = [sid for step in trained for sid in step]
    assert all(len(step) == 4 * 4 for step in trained)  # 4 prompts x group of 4, none missing
    assert [sid for sid, n in Counter(everything).items() if n > 1] == []  # none twice
    rows = e2e.rows(e2e.sqlite_url(run_dir))
    # worker-0's request came back twice (its own publish + worker-2's); a slow worker-2 request
    # may also be claimed by nobody else here (one live worker), so exactly one duplicate
    assert sum(m["duplicate_chunks"] for m in rows.step_metrics(0)) == 1

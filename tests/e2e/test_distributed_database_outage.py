"""The distributed learner rides out its database too: a PRIVATE Postgres (the learner's `--db`)
restarted for real at a random step of a short `cascade.up.stack.LocalStack` run of the tiny model.
The learner runs the embedded run's loop and store (tests/e2e/test_database_outage.py), here
with its own process, heartbeat and Prometheus metrics: the run completes, steps contiguous, no
sample trained twice, the outage in the step metrics and in `cascade_learner_dependency_*`.
Needs Redis on 127.0.0.1:6379 (the streams and the reward broker; skipped without it).
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from private_postgres import PrivatePostgres
from stack_probe import REDIS_URL, redis_up

from cascade.up.stack import LocalStack, Proc

pytestmark = pytest.mark.postgres

STEPS = 6


def _trained(run_dir: Path) -> list[list[str]]:
    path = run_dir / "samples.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["sample_ids"] for line in path.read_text().splitlines() if line.strip()]


def _wait(what: str, check: Any, proc: Proc, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert proc.alive(), f"{proc.name} exited while waiting for {what}:\n{proc.log()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s}s:\n{proc.log()[-3000:]}"
        time.sleep(0.1)


def _prometheus(port: int | None, name: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        s.labels["dependency"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def test_the_learner_rides_out_a_postgres_restart(e2e: Any, random_tiny_model: Path, tmp_path: Path) -> None:
    if not redis_up():
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    pg = PrivatePostgres()

    def edit(data: dict[str, Any]) -> None:
        data["rollout"] = {"seeding": "per_request", "prompts_per_request": 1}
        data["stages"] = data["stages"][:1]
        data["stages"][0]["advance"]["max_steps"] = STEPS
        data["stages"][0]["eval"] = {"every": STEPS}
        data["lease"] = {"heartbeat_s": 1, "expiry_s": 10}

    e2e.config(tmp_path, edit)
    url = pg.database("learner")
    run_dir = tmp_path / "run"
    stack = LocalStack(
        config=tmp_path / "cascade.yaml",
        model=random_tiny_model,
        run_dir=run_dir,
        log_dir=tmp_path / "logs",
        redis_url=REDIS_URL,
        celery_workers=0,  # `if` is scored in the reward front
        db=url,
    )
    stack.stream_prefix = f"cascade:pg:{uuid.uuid4().hex[:8]}"
    at = random.Random().randint(1, STEPS - 2)
    print(f"Postgres restarted after global step {at}")
    try:
        stack.start_services(timeout_s=180)
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        _wait(f"step {at}", lambda: len(_trained(run_dir)) >= at, learner)
        t0 = time.monotonic()
        pg.stop()
        _wait("the database found down", lambda: "database unreachable" in learner.log(), learner)
        degraded = _prometheus(learner.metrics_port, "cascade_learner_dependency_degraded")
        time.sleep(max(0.0, 2.5 - (time.monotonic() - t0)))
        pg.start()
        _wait("the database back", lambda: "database back after" in learner.log(), learner)
        outages = _prometheus(learner.metrics_port, "cascade_learner_dependency_outages_total")
        assert stack.wait(timeout_s=300) == 0, learner.log()[-3000:]
        log = learner.log()
    finally:
        stack.stop()
    try:
        assert degraded.get("database") == 1.0, degraded
        assert outages.get("database") == 1.0, outages
        assert log.count("database unreachable") == 1 and "Traceback" not in log, log[-3000:]
        rows = e2e.rows(url)
        assert rows.run_status == "completed"
        assert [g for _, _, g, _ in rows.steps] == list(range(1, STEPS + 1))
        trained = _trained(run_dir)
        everything = [sid for step in trained for sid in step]
        assert len(trained) == STEPS and [s for s, n in Counter(everything).items() if n > 1] == []
        assert max(m["resilience/database_outages"] for _, _, _, m in rows.steps) == 1
    finally:
        pg.close()

"""What a test reads off a running distributed stack: the samples log (which sample ids each
optimizer step trained) and the learner's Prometheus dependency counters; and whether the
shared Redis the stacks use answers."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

REDIS_URL = os.environ.get("CASCADE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_up(url: str = REDIS_URL) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=2).ping())
    except redis.RedisError:
        return False


def trained(run_dir: Path) -> list[list[str]]:
    """The sample ids of each step in the run's samples log, in order (empty before step 1)."""
    path = run_dir / "samples.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["sample_ids"] for line in path.read_text().splitlines() if line.strip()]


def dependency_series(port: int | None, name: str = "outages") -> dict[str, float]:
    """`cascade_learner_dependency_<name>_total` by dependency, from the learner's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        s.labels["dependency"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == f"cascade_learner_dependency_{name}_total"
    }

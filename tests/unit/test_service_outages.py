"""The distributed learner's service dependencies: bounds from `resilience.*`, Prometheus series
read live (also while an outage is open), and a teacher service that stays away stops the call
past its bound with `DependencyDown` naming it (a real gRPC channel to a port nobody serves)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cascade.config import ResilienceConfig
from cascade.resilience import DependencyDown
from cascade.transport.channel import ServiceUnavailable
from cascade.up import free_port
from services.learner.learner import ServiceOutages
from services.learner.metrics import LearnerMetrics
from services.learner.replicas import NoReplicaLeft
from services.learner.sources import ServiceTeachers


def test_bounds_come_from_the_resilience_config() -> None:
    outages = ServiceOutages.from_config(ResilienceConfig(redis_s=7, teacher_s=8, rollout_s=9), print)
    assert [(d.name, d.give_up_after_s) for d in outages.all()] == [
        ("redis", 7),
        ("teacher", 8),
        ("rollout", 9),
    ]
    assert outages.teacher.transient == (ServiceUnavailable,) and outages.rollout.transient == (
        NoReplicaLeft,
    )


def test_prometheus_shows_an_open_outage_and_counts_it() -> None:
    outages = ServiceOutages.from_config(ResilienceConfig(), lambda line: None)
    metrics = LearnerMetrics()
    metrics.watch(outages.all())

    def scrape() -> dict[tuple[str, str], float]:
        text = generate_latest(metrics.registry).decode()
        return {
            (s.name, s.labels.get("dependency", "")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name.startswith("cascade_learner_dependency_")
        }

    assert scrape()[("cascade_learner_dependency_degraded", "redis")] == 0
    outages.redis.failed(ConnectionError("refused"))
    now = scrape()
    assert now[("cascade_learner_dependency_degraded", "redis")] == 1
    assert now[("cascade_learner_dependency_outages_total", "redis")] == 1
    assert now[("cascade_learner_dependency_outages_total", "teacher")] == 0
    outages.redis.succeeded()
    after = scrape()
    assert after[("cascade_learner_dependency_degraded", "redis")] == 0
    assert after[("cascade_learner_dependency_down_seconds_total", "redis")] >= 0


def test_a_teacher_service_away_past_its_bound_stops_the_call() -> None:
    lines: list[str] = []
    outages = ServiceOutages.from_config(ResilienceConfig(teacher_s=1.0), lines.append)
    teachers = ServiceTeachers(
        f"127.0.0.1:{free_port()}", vocab_size=8, log=lines.append, outage=outages.teacher
    )
    t0 = time.monotonic()
    try:
        with pytest.raises(DependencyDown, match=r"teacher unreachable for 1s .*UNAVAILABLE"):
            teachers.register("if", Path("/nowhere/if-g000001"))
    finally:
        teachers.close()
    assert 1.0 <= time.monotonic() - t0 < 10
    assert sum("teacher unreachable" in line for line in lines) == 1, lines

"""The distributed learner's service dependencies: bounds from `resilience.*`, Prometheus series
read live (also while an outage is open), and a teacher service that stays away stops the call
past its bound with `DependencyDown` naming it (a real gRPC channel to a port nobody serves)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cascade.config import ResilienceConfig
from cascade.distill.samples import DistillSamples
from cascade.resilience import Dependency, DependencyDown
from cascade.transport.channel import ServiceUnavailable
from cascade.up.stack import free_port
from services.learner.learner import ServiceOutages
from services.learner.metrics import LearnerMetrics
from services.learner.replicas import NoReplicaLeft
from services.learner.sources import ServiceTeachers


def test_bounds_come_from_the_resilience_config() -> None:
    outages = ServiceOutages.from_config(
        ResilienceConfig(redis_s=7, teacher_s=8, rollout_s=9, reward_s=10), print
    )
    assert [(d.name, d.give_up_after_s) for d in outages.all()] == [
        ("redis", 7),
        ("teacher", 8),
        ("rollout", 9),
        ("reward", 10),
    ]
    assert outages.teacher.transient == (ServiceUnavailable,) and outages.rollout.transient == (
        NoReplicaLeft,
    )
    assert outages.reward.transient == (ServiceUnavailable,)


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


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class RestartingTeacherService:
    """A teacher service that goes down once (UNAVAILABLE), then comes back without the teachers
    it was given, as a restarted process does."""

    def __init__(self) -> None:
        self.teachers: dict[str, str] = {}
        self.down_for = 2  # calls answered UNAVAILABLE
        self.calls: list[str] = []

    def set_teacher(self, name: str, path: str) -> None:
        self.calls.append(f"set {name}")
        self.teachers[name] = path

    def logprobs(self, teacher: str, prompts: Any, completions: Any, **kw: Any) -> str:
        self.calls.append(f"logprobs {teacher}")
        if self.down_for:
            self.down_for -= 1
            self.teachers.clear()  # restarted: it forgot them
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")
        if teacher not in self.teachers:
            raise FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown teacher {teacher!r} (known: none)")
        return f"scores of {teacher}"

    def close(self) -> None:
        pass


def test_a_restarted_teacher_service_is_given_its_teachers_again_and_the_call_retried() -> None:
    lines: list[str] = []
    outage = Dependency(
        "teacher", give_up_after_s=60, transient=(ServiceUnavailable,), log=lines.append, sleep=lambda s: None
    )
    teachers = ServiceTeachers("unused:1", vocab_size=8, log=lines.append, outage=outage)
    service = RestartingTeacherService()
    teachers.client = service  # type: ignore[assignment]
    teachers.register("if", Path("/run/teachers/if-g000003"))
    teachers.register("math", Path("/run/teachers/math-g000006"))
    samples = DistillSamples("if", [[1]], [[2]], [[-1.0]], 1.0)
    assert teachers._logprobs("if", samples) == "scores of if"
    assert service.calls[2:] == [
        "logprobs if",  # UNAVAILABLE twice: one outage, retried
        "logprobs if",
        "logprobs if",  # back, but it forgot: every teacher again, then the call
        "set if",
        "set math",
        "logprobs if",
    ]
    assert service.teachers == {"if": "/run/teachers/if-g000003", "math": "/run/teachers/math-g000006"}
    assert outage.stats.outages == 1 and not outage.degraded and teachers.reregistered == 1
    assert any("registered if, math again" in line for line in lines), lines
    service.teachers.clear()
    with pytest.raises(grpc.RpcError):  # a teacher never registered is a real error
        teachers._logprobs("code", samples)

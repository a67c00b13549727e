"""The learner's Prometheus metrics: where training is, how fast, and how long it waits."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cascade.resilience import Dependency


class DependencyCollector(Collector):
    """Each watched dependency's outages, read when scraped (also while an outage is open and
    no step completes): begun, seconds down (ended outages), and whether one is open now."""

    def __init__(self) -> None:
        self.dependencies: list[Dependency] = []

    def collect(self) -> Iterator[Metric]:
        outages = CounterMetricFamily(
            "cascade_learner_dependency_outages",
            "Outages of a dependency (each counted once, however many calls failed in it).",
            labels=["dependency"],
        )
        down = CounterMetricFamily(
            "cascade_learner_dependency_down_seconds",
            "Seconds a dependency was unreachable, in outages that have ended.",
            labels=["dependency"],
        )
        degraded = GaugeMetricFamily(
            "cascade_learner_dependency_degraded",
            "1 while an outage of the dependency is open (calls retried, the run waiting).",
            labels=["dependency"],
        )
        for dep in self.dependencies:
            outages.add_metric([dep.name], float(dep.stats.outages))
            down.add_metric([dep.name], dep.stats.down_s)
            degraded.add_metric([dep.name], 1.0 if dep.degraded else 0.0)
        yield from (outages, down, degraded)


class LearnerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.steps = Counter("cascade_learner_steps", "Optimizer steps taken.", registry=self.registry)
        self.global_step = Gauge(
            "cascade_learner_global_step", "The last step's number.", registry=self.registry
        )
        self.reward = Gauge(
            "cascade_learner_reward_mean", "Mean reward of the last step.", registry=self.registry
        )
        self.idle = Gauge(
            "cascade_learner_idle_fraction",
            "Share of the last step spent waiting for rollouts, scores or teachers.",
            registry=self.registry,
        )
        self.duplicates = Counter(
            "cascade_learner_duplicate_chunks",
            "Redelivered rollout chunks dropped (their sample ids were already trained on).",
            registry=self.registry,
        )
        self.replicas = Gauge(
            "cascade_learner_rollout_replicas",
            "Rollout replicas in service (holding the last pushed weights).",
            registry=self.registry,
        )
        self.replicas_out = Gauge(
            "cascade_learner_rollout_replicas_out",
            "Rollout replicas taken out of service (a failed push or generation) and not re-added.",
            registry=self.registry,
        )
        self.replica_failures = Counter(
            "cascade_learner_rollout_replica_failures",
            "Rollout replicas taken out of service, by replica and by what failed (push, generate, attach).",
            ["replica", "during"],
            registry=self.registry,
        )
        self.push_seconds = Histogram(
            "cascade_learner_weight_push_seconds",
            "Wall time of one weight push to every replica (save included).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.dependencies = DependencyCollector()
        self.registry.register(self.dependencies)
        self.step_seconds = Histogram(
            "cascade_learner_step_seconds",
            "Wall time of one step.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )

    def observe(self, global_step: int, metrics: dict[str, Any]) -> None:
        self.steps.inc()
        self.global_step.set(global_step)
        self.reward.set(float(metrics.get("reward_mean", 0.0)))
        self.idle.set(float(metrics.get("idle_fraction", 0.0)))
        self.duplicates.inc(float(metrics.get("duplicate_chunks", 0.0)))
        self.step_seconds.observe(float(metrics.get("time_step_s", 0.0)))
        if "rollout_replicas" in metrics:
            self.replicas.set(float(metrics["rollout_replicas"]))
            self.replicas_out.set(float(metrics["replicas_out"]))
        if "time_push_s" in metrics:
            self.push_seconds.observe(float(metrics["time_push_s"]))

    def watch(self, dependencies: Iterable[Dependency]) -> None:
        """Report these dependencies' outages (`cascade.resilience`) from now on."""
        self.dependencies.dependencies.extend(dependencies)

    def replica_failed(self, replica: str, during: str) -> None:
        self.replica_failures.labels(replica, during).inc()
        self.replicas_out.inc()

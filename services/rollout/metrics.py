"""The rollout service's Prometheus metrics, in their own registry (built per server, not at
import, so tests and several servers in one process do not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class RolloutMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "cascade_rollout_requests",
            "RPCs by method and gRPC status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cascade_rollout_request_seconds",
            "Wall time of an RPC.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "cascade_rollout_in_flight_requests", "RPCs being served now.", ["method"], registry=self.registry
        )
        self.tokens = Counter(
            "cascade_rollout_generated_tokens", "Completion tokens sampled.", registry=self.registry
        )
        self.sequences = Counter(
            "cascade_rollout_completions",
            "Completions by finish reason.",
            ["finish_reason"],
            registry=self.registry,
        )
        self.policy_version = Gauge(
            "cascade_rollout_policy_version",
            "Version of the weights new requests use.",
            registry=self.registry,
        )
        self.update_seconds = Histogram(
            "cascade_rollout_weight_update_seconds",
            "Read + check + switch time of accepted weight updates.",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.update_bytes = Counter(
            "cascade_rollout_weight_update_bytes",
            "Tensor bytes of accepted weight updates.",
            ["source"],
            registry=self.registry,
        )
        self.turn_rounds = Counter(
            "cascade_rollout_turn_rounds",
            "Later rounds of multi-turn rollouts (hf engine): kv=reused prefilled only their new ids "
            "on the kept keys/values, kv=full prefilled whole contexts (a miss: see "
            "cascade/engine/prefix_kv.py).",
            ["kv"],
            registry=self.registry,
        )
        self.turn_kv_bytes = Gauge(
            "cascade_rollout_turn_kv_bytes",
            "Keys/values kept between the rounds of multi-turn rollouts (hf engine).",
            registry=self.registry,
        )
        self.updates_refused = Counter(
            "cascade_rollout_weight_updates_refused",
            "Weight updates refused (the old weights kept serving).",
            ["source"],
            registry=self.registry,
        )

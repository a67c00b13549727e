"""The front's Prometheus metrics, and the small HTTP server for `/metrics` and `/health`.

Metrics live in their own registry (built by `RewardMetrics()`, not at import), so tests and
several servers in one process do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RewardMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "cascade_reward_requests",
            "Scoring RPCs by method, domain and gRPC status code.",
            ["method", "domain", "code"],
            registry=self.registry,
        )
        self.items = Counter(
            "cascade_reward_items",
            "Scored items by domain and verdict reason (infra_error: the verifier failed).",
            ["domain", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cascade_reward_request_seconds",
            "Wall time of a scoring RPC, from request to last verdict.",
            ["method", "domain"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.over_long = Counter(
            "cascade_reward_over_long_items",
            "Items whose response was over the domain's max_response_chars (output_limit, unread).",
            ["domain"],
            registry=self.registry,
        )
        self.deadline_expired = Counter(
            "cascade_reward_deadline_expired_items",
            "Items left unscored (infra_error) because the RPC's deadline passed first.",
            ["domain"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "cascade_reward_in_flight_requests",
            "Scoring RPCs being served now.",
            ["method"],
            registry=self.registry,
        )

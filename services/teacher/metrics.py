"""The teacher service's Prometheus metrics, in their own registry (built per server)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class TeacherMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "cascade_teacher_requests", "RPCs by method and gRPC status code.", ["method", "code"], registry=r
        )
        self.latency = Histogram(
            "cascade_teacher_request_seconds",
            "Wall time of an RPC.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "cascade_teacher_in_flight_requests", "RPCs being served now.", ["method"], registry=r
        )
        self.tokens = Counter(
            "cascade_teacher_scored_tokens",
            "Completion tokens scored, by teacher and mode.",
            ["teacher", "mode"],
            registry=r,
        )
        self.response_bytes = Counter(
            "cascade_teacher_response_bytes",
            "Serialized Logprobs response bytes, by mode.",
            ["mode"],
            registry=r,
        )
        self.bytes_per_token = Gauge(
            "cascade_teacher_wire_bytes_per_token",
            "Response bytes per scored token since start, by mode (the wire cost of a distillation mode).",
            ["mode"],
            registry=r,
        )
        self.batch_sequences = Histogram(
            "cascade_teacher_batch_sequences",
            "Sequences per forward batch (several requests share one).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "cascade_teacher_batch_requests",
            "Requests merged into one forward batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.resident_bytes = Gauge(
            "cascade_teacher_resident_bytes", "Weight bytes of the teachers in memory.", registry=r
        )
        self.loads = Gauge("cascade_teacher_loads", "Teacher loads since start.", registry=r)
        self.evictions = Gauge(
            "cascade_teacher_evictions", "Teachers dropped to stay within the memory budget.", registry=r
        )
        self._bytes: dict[str, int] = {}
        self._tokens: dict[str, int] = {}

    def record_response(self, teacher: str, mode: str, tokens: int, nbytes: int) -> None:
        self.tokens.labels(teacher, mode).inc(tokens)
        self.response_bytes.labels(mode).inc(nbytes)
        self._bytes[mode] = self._bytes.get(mode, 0) + nbytes
        self._tokens[mode] = self._tokens.get(mode, 0) + tokens
        self.bytes_per_token.labels(mode).set(self._bytes[mode] / max(self._tokens[mode], 1))

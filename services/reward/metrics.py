"""The front's Prometheus metrics, and the small HTTP server for `/metrics` and `/health`.

Metrics live in their own registry (built by `RewardMetrics()`, not at import), so tests and
several servers in one process do not collide.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

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
        self.in_flight = Gauge(
            "cascade_reward_in_flight_requests",
            "Scoring RPCs being served now.",
            ["method"],
            registry=self.registry,
        )


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def start_http_server(
    host: str, port: int, registry: CollectorRegistry, health: Callable[[], bool]
) -> WSGIServer:
    """Serve `/metrics` (Prometheus text format) and `/health` (200 `SERVING` or 503) in a
    daemon thread; returns the server (its `server_port` is the bound port)."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/health":
            ok = health()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"SERVING\n" if ok else b"NOT_SERVING\n"]
        return metrics_app(environ, start_response)

    server = make_server(host, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server

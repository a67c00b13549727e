"""A gRPC server with standard health checking (`grpc.health.v1`), shared by the services.

Health reports SERVING for "" and for each named service once `set_serving(..., True)` is
called (after the model is loaded), so an orchestrator's probe never routes to a cold process.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, Protocol
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def build_grpc_server(
    register: Callable[[grpc.Server], None],
    *,
    address: str,
    max_workers: int,
    thread_prefix: str,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[grpc.Server, health.HealthServicer, int]:
    """The server (not started) with the services `register` adds plus health; the bound port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_prefix),
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ],
    )
    register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return server, health_servicer, port


def set_serving(health_servicer: health.HealthServicer, service_names: Sequence[str], serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", *service_names):
        health_servicer.set(name, status)


def serve_until_signalled(
    server: grpc.Server,
    health_servicer: health.HealthServicer,
    service_names: Sequence[str],
    http: WSGIServer,
    serving: threading.Event,
    *,
    on_ready: Callable[[], None] = lambda: None,
    grace_s: float = 5.0,
) -> None:
    """Start `server`, report SERVING (gRPC health and the HTTP `/health` that reads `serving`),
    block until SIGTERM or SIGINT, then report NOT_SERVING, give RPCs in flight `grace_s` and
    stop the HTTP server. Must run on the main thread (signal handlers)."""
    server.start()
    set_serving(health_servicer, service_names, True)
    serving.set()
    on_ready()
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop.wait()
    log.info("stopping")
    serving.clear()
    set_serving(health_servicer, service_names, False)
    server.stop(grace=grace_s).wait()
    http.shutdown()


class RpcMetrics(Protocol):
    """What `RpcCall` records; each service's metrics object provides these three."""

    requests: Counter  # labels: method, code
    latency: Histogram  # labels: method
    in_flight: Gauge  # labels: method


class RpcCall:
    """One RPC: in-flight gauge, latency and outcome, and the error-to-status mapping.

    Exceptions of the `invalid` types become INVALID_ARGUMENT with their message (the caller's
    fault; the service is fine), `precondition` types FAILED_PRECONDITION; anything else is
    logged and answered INTERNAL, so no request can take the server down.
    """

    def __init__(
        self,
        context: grpc.ServicerContext,
        metrics: RpcMetrics,
        method: str,
        *,
        invalid: tuple[type[BaseException], ...] = (),
        precondition: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.context = context
        self.metrics = metrics
        self.method = method
        self.invalid = invalid
        self.precondition = precondition
        self.code = grpc.StatusCode.OK

    def __enter__(self) -> RpcCall:
        self.start = time.perf_counter()
        self.metrics.in_flight.labels(self.method).inc()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.metrics.in_flight.labels(self.method).dec()
        message = ""
        if exc is None:
            pass
        elif isinstance(exc, self.invalid):
            self.code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        elif isinstance(exc, self.precondition):
            self.code, message = grpc.StatusCode.FAILED_PRECONDITION, str(exc)
        elif isinstance(exc, Exception) and self.code == grpc.StatusCode.OK:
            # not an abort from inside the handler (that would have set `code`): a bug or a fault
            log.error("%s failed", self.method, exc_info=exc)
            self.code, message = grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
        self.metrics.requests.labels(self.method, self.code.name).inc()
        self.metrics.latency.labels(self.method).observe(time.perf_counter() - self.start)
        if message:
            self.context.abort(self.code, message)

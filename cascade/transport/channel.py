"""gRPC channels of the learner's and workers' clients, and which failures are an outage.

A service restarted on the same address must be found again within about a second: the channel's
reconnect backoff (by default growing to two minutes) is capped, so a retry after the restart
reaches the new process instead of failing fast on a channel still waiting out its backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

T = TypeVar("T")

RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]

TRANSIENT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
"""The service is not there (down, restarting, shutting down): another try may succeed. Every
other code says something about the request and is never retried."""


class ServiceUnavailable(ConnectionError):
    """A gRPC call failed with a `TRANSIENT_CODES` code (the outage's cause, retried)."""


def open_channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target, options=RECONNECT_OPTIONS)


def is_transient(err: BaseException) -> bool:
    return isinstance(err, grpc.RpcError) and err.code() in TRANSIENT_CODES


def unavailable(service: str, err: grpc.RpcError) -> ServiceUnavailable:
    details = err.details() if hasattr(err, "details") else ""
    return ServiceUnavailable(f"{service} {err.code().name}: {details}")


def outage_aware(service: str, fn: Callable[[], T]) -> T:
    """`fn()`, with a `TRANSIENT_CODES` failure raised as `ServiceUnavailable` (what a
    `cascade.resilience.Dependency` retries); any other failure as it is."""
    try:
        return fn()
    except grpc.RpcError as err:
        if is_transient(err):
            raise unavailable(service, err) from err
        raise

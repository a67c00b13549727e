"""Waiting for a gRPC service to report SERVING (grpc.health.v1), for whoever starts one."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def wait_until_serving(
    address: str,
    *,
    timeout_s: float,
    alive: Callable[[], bool] = lambda: True,
    service: str = "",
    poll_s: float = 0.1,
) -> str | None:
    """None once `service` at `address` answers SERVING; else why not (`exited`: `alive()` turned
    False, `timeout`: `timeout_s` passed). The caller adds its log to the error it raises."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if not alive():
                return "exited"
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return None
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(poll_s)

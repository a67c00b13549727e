"""What the gRPC services' entry points share: the bind, metrics, RPC-thread and log flags, the
logging set up after parsing, and serving until SIGTERM/SIGINT with gRPC health beside an HTTP
`/metrics` + `/health` port.

The HTTP port starts first (its `/health` says not serving until the gRPC server is up), so a
service that loads a model for minutes is reachable, and says so, while it loads. Nothing heavy
is imported here at module level: each service parses its flags before torch or gRPC load.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    import grpc
    from prometheus_client import CollectorRegistry

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_serving_arguments(
    p: argparse.ArgumentParser, *, port: int, metrics_port: int, rpc_threads: int
) -> None:
    """`--host`, `--port`, `--metrics-port`, `--rpc-threads`, `--log-level` with this service's
    defaults."""
    p.add_argument("--host", default="0.0.0.0", help="address for gRPC and HTTP (default: %(default)s)")
    p.add_argument("--port", type=int, default=port, help="gRPC port (default: %(default)s)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=metrics_port,
        help="HTTP /metrics and /health (default: %(default)s)",
    )
    p.add_argument(
        "--rpc-threads", type=int, default=rpc_threads, help="concurrent RPCs (default: %(default)s)"
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def run_service(
    parse_args: Callable[[list[str] | None], argparse.Namespace],
    serve: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """A service's `main`: flags (answered before anything heavy loads), logging, then `serve`."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format=LOG_FORMAT)
    return serve(args)


@dataclass
class MetricsPort:
    http: WSGIServer
    serving: threading.Event
    """Set once the gRPC server is up; the HTTP `/health` reads it."""


def start_metrics_port(args: argparse.Namespace, registry: CollectorRegistry) -> MetricsPort:
    from cascade.transport.http import start_http_server

    serving = threading.Event()
    http = start_http_server(args.host, args.metrics_port, registry, health=serving.is_set)
    return MetricsPort(http, serving)


def serve_grpc(
    args: argparse.Namespace,
    metrics_port: MetricsPort,
    register: Callable[[grpc.Server], None],
    *,
    service_name: str,
    thread_prefix: str,
    log: logging.Logger,
    ready: Callable[[int, int], str],
    **server_options: Any,
) -> None:
    """Bind the gRPC server (`register` adds the servicer), serve until signalled, and log
    `ready(grpc_port, metrics_port)` once serving. `server_options` go to `build_grpc_server`
    (e.g. `max_message_bytes`)."""
    from cascade.transport.grpc_server import build_grpc_server, serve_until_signalled

    server, health, port = build_grpc_server(
        register,
        address=f"{args.host}:{args.port}",
        max_workers=args.rpc_threads,
        thread_prefix=thread_prefix,
        **server_options,
    )
    http = metrics_port.http
    serve_until_signalled(
        server,
        health,
        [service_name],
        http,
        metrics_port.serving,
        on_ready=lambda: log.info("%s", ready(port, http.server_port)),
    )

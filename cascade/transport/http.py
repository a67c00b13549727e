"""The small HTTP server every service runs next to gRPC: `/metrics` (Prometheus text format,
from the service's own registry) and `/health` (200 SERVING or 503 NOT_SERVING)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def start_http_server(
    host: str, port: int, registry: CollectorRegistry, health: Callable[[], bool]
) -> WSGIServer:
    """Serve in a daemon thread; returns the server (`server_port` is the bound port)."""
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

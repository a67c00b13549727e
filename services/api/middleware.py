"""ASGI middleware around the whole application: security headers on every response, a bound on
how long a request body may take to arrive, and the request metrics with bounded labels.

Pure ASGI (not `BaseHTTPMiddleware`): they see every message, including a response that an
exception handler or a mounted static directory produced, and an exception raised while the
body is read reaches the route's handlers as itself (`BaseHTTPMiddleware` reads the body in a
task group, which would wrap it in an exception group: a 500).
"""

from __future__ import annotations

import asyncio
import logging
import time
from http import HTTPStatus

from fastapi import HTTPException, status
from fastapi.responses import JSONResponse
from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("cascade.api")

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)
"""On every response: no MIME sniffing (a JSON body is never run as a page), no framing by any
site (the API shares the dashboard's origin, whose page may hold a write token)."""
JSON_CSP = b"default-src 'none'; frame-ancestors 'none'"
"""A JSON body loads nothing and is framed by no one."""
OTHER_CSP = b"frame-ancestors 'none'"
"""`/docs` and `/redoc` (Swagger UI runs an inline script) and static files: no framing."""


class SecurityHeaders:
    """Adds `SECURITY_HEADERS` and a Content-Security-Policy to every HTTP response that does not
    set its own (the dashboard's page sets a stricter one, `routes_ops.DASHBOARD_HEADERS`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                named = {bytes(name).lower(): bytes(value) for name, value in headers}
                is_json = named.get(b"content-type", b"").split(b";")[0].strip().endswith(b"json")
                wanted = (*SECURITY_HEADERS, (b"content-security-policy", JSON_CSP if is_json else OTHER_CSP))
                headers += [(name, value) for name, value in wanted if name not in named]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _declares_body(scope: Scope) -> bool:
    named = {bytes(name).lower(): bytes(value).strip() for name, value in scope.get("headers", [])}
    return b"transfer-encoding" in named or named.get(b"content-length", b"0") not in (b"", b"0")


class BodyTimeout:
    """Bounds how long a request body may take to arrive, from the moment the request's headers
    were read to its last byte (uvicorn bounds neither: a client that sends part of a body and
    stalls, or trickles it, would hold its request open for ever).

    Past the bound, a handler that is reading the body gets HTTPException 408 (answered
    `408 Request Timeout`, `Connection: close`, counted like any answer); once a response has
    begun, a late read gets `http.disconnect` instead. A response sent before the declared body
    has arrived carries `Connection: close`, so the server never waits on the rest of it.
    """

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _declares_body(scope):
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        state = {"complete": False, "responding": False}

        async def timed_receive() -> Message:
            if state["complete"]:  # after the body: waiting for a disconnect is not bounded here
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                if state["responding"]:
                    state["complete"] = True
                    return {"type": "http.disconnect"}
                raise HTTPException(
                    status.HTTP_408_REQUEST_TIMEOUT,
                    f"request body not received within {self.timeout_s:g} s "
                    "(the API's limits.body_timeout_s)",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["complete"] = True
            return message

        async def marked_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["responding"] = True
                if not state["complete"]:
                    headers = message.get("headers", [])
                    kept = [(n, v) for n, v in headers if bytes(n).lower() != b"connection"]
                    message = {**message, "headers": [*kept, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, timed_receive, marked_send)


KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATUSES = frozenset(int(s) for s in HTTPStatus)


def method_label(method: str) -> str:
    """The request's method for a metric label: one of `KNOWN_METHODS`, else `other` (any token
    is a valid method name: unbounded, each would be a new series)."""
    return method if method in KNOWN_METHODS else "other"


def status_label(code: int) -> str:
    """A registered HTTP status code, else `other`."""
    return str(code) if code in _STATUSES else "other"


def route_label(scope: Scope) -> str:
    """The matched route's template (`/api/cascades/{cascade_id}`), else `unmatched`: never the
    requested path."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else "unmatched"


class RequestMetrics:
    """Counts every answered request (`method`, `route`, `status`, each from a bounded set) and
    its latency by route. An unexpected exception is logged with its traceback and answered, and
    counted, as the generic 500 it is (unless the response had begun: then it goes on up)."""

    def __init__(self, app: ASGIApp, requests: Counter, latency: Histogram) -> None:
        self.app = app
        self.requests = requests
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        answered: list[int] = []

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, noted)
        except Exception:  # noqa: BLE001 - a bug: answered (and counted) as the 500 it is
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if answered:
                raise
            await JSONResponse({"detail": "internal server error"}, status_code=500)(scope, receive, noted)
        finally:
            template = route_label(scope)
            code = answered[0] if answered else 500
            method = method_label(str(scope.get("method", "")))
            self.requests.labels(method, template, status_label(code)).inc()
            self.latency.labels(template).observe(time.perf_counter() - start)

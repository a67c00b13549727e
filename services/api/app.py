"""The FastAPI application: built once from an engine and a token table, no globals.

`create_app` wires the routers, maps the store's exceptions to HTTP (NotFound 404,
IllegalTransition 409 with the current state, ConfigError 422 naming the field), counts
requests for Prometheus, serves the dashboard, and puts the cascade config's JSON schema in
the OpenAPI document so clients (and schemathesis) see what a create request takes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry, Counter, Histogram
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, OperationalError

from cascade.config import CascadeConfig, ConfigError
from cascade.store.lifecycle import IllegalTransition, NotFound
from services.api import routes_cascades, routes_ops, routes_stages
from services.api.routes_ops import STATIC
from services.api.settings import TokenTable

API_VERSION = "1"


def _field_of(message: str) -> str | None:
    """`body: stages.0.grpo.group_size: Input should be ...` -> `stages.0.grpo.group_size`."""
    parts = message.split(": ", 2)
    if len(parts) == 3 and not parts[1].startswith(("invalid ", "not UTF-8")):
        return parts[1]
    return None


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(NotFound)
    async def not_found(request: Request, err: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=404)

    @app.exception_handler(IllegalTransition)
    async def conflict(request: Request, err: IllegalTransition) -> JSONResponse:
        body = {"detail": str(err), "current_state": err.current, "requested_state": err.requested}
        return JSONResponse(body, status_code=409)

    @app.exception_handler(ConfigError)
    async def bad_config(request: Request, err: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(err), "field": _field_of(str(err))}, status_code=422)

    @app.exception_handler(DataError)
    async def unstorable(request: Request, err: DataError) -> JSONResponse:
        first = str(err.orig).strip().splitlines()[0] if err.orig else "value out of range"
        return JSONResponse({"detail": f"the database refused a value: {first}"}, status_code=422)

    @app.exception_handler(OperationalError)
    async def database_down(request: Request, err: OperationalError) -> JSONResponse:
        return JSONResponse({"detail": "database unavailable"}, status_code=503)


def _install_metrics(app: FastAPI, registry: CollectorRegistry) -> None:
    requests = Counter(
        "cascade_api_requests", "HTTP requests answered", ["method", "route", "status"], registry=registry
    )
    latency = Histogram("cascade_api_request_seconds", "request latency", ["route"], registry=registry)

    @app.middleware("http")
    async def count(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        requests.labels(request.method, template, str(response.status_code)).inc()
        latency.labels(template).observe(time.perf_counter() - start)
        return response


def _openapi(app: FastAPI) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            config_schema = CascadeConfig.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(config_schema.pop("$defs", {}))
            components["CascadeConfig"] = config_schema
            app.openapi_schema = schema
        return app.openapi_schema

    return build


def create_app(engine: Engine, tokens: TokenTable) -> FastAPI:
    app = FastAPI(
        title="Cascade control plane",
        version=API_VERSION,
        description="Create cascades, steer their stages (start, pause, resume, advance, abort) and "
        "read what their runs recorded. Mutating routes need a bearer token with role `write`.",
    )
    app.state.engine = engine
    app.state.tokens = tokens
    app.state.registry = CollectorRegistry()
    _install_error_handlers(app)
    _install_metrics(app, app.state.registry)
    app.include_router(routes_cascades.router)
    app.include_router(routes_stages.router)
    app.include_router(routes_ops.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.openapi = _openapi(app)  # type: ignore[method-assign]
    return app

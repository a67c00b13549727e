"""The FastAPI application: built once from an engine and a token table, no globals.

`create_app` wires the routers, maps the store's exceptions to HTTP (NotFound 404,
IllegalTransition 409 with the current state, ConfigError 422 naming the field), counts
every request for Prometheus (an unexpected error too, as the 500 it is answered with; every
label from a bounded set: known methods else `other`, route templates else `unmatched`),
bounds how long a request body may take (408), puts security headers on every response
(`middleware`), serves the dashboard and the OpenAPI UIs from local assets (no CDN: `/docs`
works offline), and puts the cascade config's JSON schema in the OpenAPI document so clients
(and schemathesis) see what a create request takes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry, Counter, Histogram
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, OperationalError

from cascade.config import CascadeConfig, ConfigError
from cascade.store.lifecycle import IllegalTransition, NotFound
from services.api import routes_cascades, routes_ops, routes_stages
from services.api.middleware import BodyTimeout, RequestMetrics, SecurityHeaders
from services.api.paths import PathRoots
from services.api.routes_ops import STATIC
from services.api.settings import ApiLimits, ApiPaths, TokenTable

API_VERSION = "1"
DOCS_ASSETS = "/docs/assets"
"""Where Swagger UI's and ReDoc's files are served from (the `fastapi-offline` package's copy)."""
log = logging.getLogger("cascade.api")


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
    app.add_middleware(RequestMetrics, requests=requests, latency=latency)


def _install_docs(app: FastAPI) -> None:
    """`/docs` (Swagger UI) and `/redoc` with their JavaScript, CSS and icon served from the
    `fastapi-offline` package's files instead of a CDN, and Swagger's online validator off."""
    assets = resources.files("fastapi_offline") / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(assets)), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            oauth2_redirect_url=oauth2_redirect,
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(oauth2_redirect, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )


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


def create_app(
    engine: Engine, tokens: TokenTable, limits: ApiLimits | None = None, paths: PathRoots | None = None
) -> FastAPI:
    """`paths`: the roots a created cascade's paths must stay in (default: `ApiPaths()`'s, from
    the working directory)."""
    app = FastAPI(
        title="Cascade control plane",
        version=API_VERSION,
        description="Create cascades, steer their stages (start, pause, resume, advance, abort), delete "
        "finished ones and read what their runs recorded. Mutating routes need a bearer token with role "
        "`write`.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.tokens = tokens
    app.state.limits = limits or ApiLimits()
    app.state.paths = paths or PathRoots.from_settings(ApiPaths())
    app.state.registry = CollectorRegistry()
    _install_error_handlers(app)
    _install_metrics(app, app.state.registry)
    # added last = outermost: headers on every answer (a 408 too), the body bound around the count
    app.add_middleware(BodyTimeout, timeout_s=app.state.limits.body_timeout_s)
    app.add_middleware(SecurityHeaders)
    _install_docs(app)
    app.include_router(routes_cascades.router)
    app.include_router(routes_stages.router)
    app.include_router(routes_stages.by_cascade)
    app.include_router(routes_ops.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.openapi = _openapi(app)  # type: ignore[method-assign]
    return app

"""Operational routes: /health, Prometheus /metrics, /api/whoami, and the dashboard's page."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import literal, select
from sqlalchemy.exc import SQLAlchemyError

from services.api import queries, schemas
from services.api.deps import EngineDep, TokenDep, unit_of_work

STATIC = Path(__file__).with_name("static")
router = APIRouter()


@router.get(
    "/health", response_model=schemas.HealthOut, tags=["ops"], responses={503: {"model": schemas.HealthOut}}
)
def health(engine: EngineDep) -> schemas.HealthOut | JSONResponse:
    """Readiness: 200 while the database answers a query, else 503 (`database: unreachable`).
    The query comes first and is not guarded: the schema revision's own fallback (a database
    without Alembic's table) must not hide a database that is down."""
    try:
        with unit_of_work(engine) as s:
            s.execute(select(literal(1))).scalar_one()
            revision = queries.schema_revision(s)
    except SQLAlchemyError:
        body = schemas.HealthOut(status="degraded", database="unreachable", schema_revision=None)
        return JSONResponse(body.model_dump(), status_code=503)
    return schemas.HealthOut(status="ok", database="ok", schema_revision=revision)


@router.get(
    "/api/whoami",
    response_model=schemas.WhoAmIOut,
    tags=["ops"],
    responses={401: {"model": schemas.ErrorOut, "description": "no or invalid bearer token"}},
)
def whoami(who: TokenDep) -> schemas.WhoAmIOut:
    """The bearer token's name and role: how the dashboard checks a token before it offers steering."""
    return schemas.WhoAmIOut(name=who.name, role=who.role, can_write=who.role == "write")


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)


DASHBOARD_HEADERS = {
    # The page may hold a write token: only its own scripts run (no inline ones, so injected
    # markup could not execute), it talks to this API only, and no other site may frame it.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@router.get("/", include_in_schema=False)
def dashboard() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=DASHBOARD_HEADERS)

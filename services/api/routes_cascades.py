"""Cascade routes: create from a config (JSON or YAML), list, read everything a run recorded,
and abort. Reads need no token; create and abort need a `write` token."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool

from cascade.config import CascadeConfig, ConfigError, parse_cascade_config, parse_cascade_yaml
from cascade.store import control, repo
from services.api import queries, schemas
from services.api.deps import EngineDep, WriterDep, unit_of_work

router = APIRouter(prefix="/api/cascades", tags=["cascades"])

MAX_BODY_BYTES = 1_000_000
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
NAME_LIMITS = {"name": 200, "stage": 200}
"""Column widths of `cascades.name` and `stages.name`."""

Id = Annotated[int, Path(ge=1, le=2**31 - 1)]
RunId = Annotated[
    int | None, Query(ge=1, le=2**31 - 1, description="which run of the cascade (default: the latest)")
]
_404: dict[int | str, dict[str, Any]] = {
    404: {"model": schemas.ErrorOut, "description": "no such cascade (or run of it)"}
}


def _check_storable(cfg: CascadeConfig) -> None:
    if len(cfg.name) > NAME_LIMITS["name"]:
        raise ConfigError(f"body: name: at most {NAME_LIMITS['name']} characters")
    for i, stage in enumerate(cfg.stages):
        label = stage.label
        if len(label) > NAME_LIMITS["stage"] or not label.isprintable():
            raise ConfigError(f"body: stages.{i}.name: at most {NAME_LIMITS['stage']} printable characters")


def _parse_body(raw: bytes, content_type: str) -> CascadeConfig:
    kind = content_type.split(";")[0].strip().lower() or "application/json"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"body: not UTF-8 text (byte {err.start})") from None
    if kind in YAML_TYPES:
        cfg = parse_cascade_yaml(text, "body")
    elif kind == "application/json":
        try:
            data: Any = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"body: invalid JSON: {err}") from None
        cfg = parse_cascade_config(data, "body")
    else:
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"send the config as application/json or application/yaml, not {kind!r}",
        )
    _check_storable(cfg)
    return cfg


_CREATE_BODY = {
    "requestBody": {
        "required": True,
        "description": "A cascade config, validated by the same models as `cascade validate`.",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/CascadeConfig"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=schemas.CascadeOut,
    openapi_extra=_CREATE_BODY,
    responses={
        401: {"model": schemas.ErrorOut},
        403: {"model": schemas.ErrorOut},
        413: {"model": schemas.ErrorOut},
        415: {"model": schemas.ErrorOut},
        422: {"model": schemas.ConfigErrorOut, "description": "invalid config; names the field"},
    },
)
async def create_cascade(request: Request, engine: EngineDep, who: WriterDep) -> schemas.CascadeOut:
    """Create a cascade and its pending stages (nothing runs until a stage is started)."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"config larger than {MAX_BODY_BYTES} bytes")
    cfg = _parse_body(raw, request.headers.get("content-type", ""))  # ConfigError -> 422 (app.py)

    def create() -> schemas.CascadeOut:
        with unit_of_work(engine) as s:
            cascade = repo.create_cascade(s, name=cfg.name, config=cfg.model_dump(mode="json"))
            repo.create_stages(s, cascade_id=cascade.id, stages=[(st.label, st.domain) for st in cfg.stages])
            repo.log_event(
                s, cascade_id=cascade.id, kind="created", actor=who.actor, detail={"stages": len(cfg.stages)}
            )
            s.flush()
            return queries.cascade_detail(s, cascade.id)

    return await run_in_threadpool(create)


@router.get("", response_model=list[schemas.CascadeSummary])
def list_cascades(
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**6)] = 0,
) -> list[schemas.CascadeSummary]:
    """Newest first."""
    with unit_of_work(engine) as s:
        return queries.list_cascades(s, limit=limit, offset=offset)


@router.get("/{cascade_id}", response_model=schemas.CascadeOut, responses=_404)
def get_cascade(cascade_id: Id, engine: EngineDep) -> schemas.CascadeOut:
    with unit_of_work(engine) as s:
        return queries.cascade_detail(s, cascade_id)


@router.get("/{cascade_id}/stages", response_model=list[schemas.StageOut], responses=_404)
def list_stages(cascade_id: Id, engine: EngineDep) -> list[schemas.StageOut]:
    with unit_of_work(engine) as s:
        return queries.cascade_detail(s, cascade_id).stages


@router.get("/{cascade_id}/metrics", response_model=schemas.MetricsOut, responses=_404)
def metrics(
    cascade_id: Id,
    engine: EngineDep,
    run_id: RunId = None,
    after_global_step: Annotated[int, Query(ge=-1, le=2**31 - 1, description="for polling")] = -1,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> schemas.MetricsOut:
    """Per-step training metrics (reward, losses, gradient norms, timings, reward reasons)."""
    with unit_of_work(engine) as s:
        return queries.metrics(s, cascade_id, run_id, after_global_step=after_global_step, limit=limit)


@router.get("/{cascade_id}/evals", response_model=schemas.EvalsOut, responses=_404)
def evals(cascade_id: Id, engine: EngineDep, run_id: RunId = None) -> schemas.EvalsOut:
    """Every domain's evals across all stages (the eval curves)."""
    with unit_of_work(engine) as s:
        return queries.evals(s, cascade_id, run_id)


@router.get("/{cascade_id}/checkpoints", response_model=list[schemas.CheckpointOut], responses=_404)
def checkpoints(cascade_id: Id, engine: EngineDep, run_id: RunId = None) -> list[schemas.CheckpointOut]:
    """Resume checkpoints and teacher candidates; `is_teacher` marks each domain's best."""
    with unit_of_work(engine) as s:
        return queries.checkpoints(s, cascade_id, run_id)


@router.get("/{cascade_id}/regression", response_model=schemas.RegressionOut, responses=_404)
def regression(cascade_id: Id, engine: EngineDep, run_id: RunId = None) -> schemas.RegressionOut:
    """Domain x stage scores: start, after each stage, best, final - best."""
    with unit_of_work(engine) as s:
        return queries.regression(s, cascade_id, run_id)


@router.get("/{cascade_id}/reasons", response_model=schemas.ReasonsOut, responses=_404)
def reasons(cascade_id: Id, engine: EngineDep, run_id: RunId = None) -> schemas.ReasonsOut:
    """Reward-reason counts: per stage over training rollouts, per domain at the latest eval."""
    with unit_of_work(engine) as s:
        return queries.reasons(s, cascade_id, run_id)


@router.get("/{cascade_id}/events", response_model=list[schemas.EventOut], responses=_404)
def events(
    cascade_id: Id,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 200,
    after_id: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> list[schemas.EventOut]:
    """The append-only log: every transition and request and who asked (the latest `limit`)."""
    with unit_of_work(engine) as s:
        return queries.events(s, cascade_id, limit=limit, after_id=after_id)


@router.post(
    "/{cascade_id}/abort",
    response_model=schemas.AbortOut,
    responses={
        **_404,
        401: {"model": schemas.ErrorOut},
        403: {"model": schemas.ErrorOut},
        409: {"model": schemas.ConflictOut, "description": "the cascade already finished"},
    },
)
def abort(cascade_id: Id, engine: EngineDep, who: WriterDep) -> schemas.AbortOut:
    """Abort the cascade: idle stages at once, a running one at its next step boundary."""
    with unit_of_work(engine) as s:
        cascade, changed = control.abort_cascade(s, cascade_id=cascade_id, actor=who.actor)
        return schemas.AbortOut(cascade=queries.cascade_summary(s, cascade), changed=changed)

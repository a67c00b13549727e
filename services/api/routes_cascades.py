"""Cascade routes: create from a config (JSON or YAML), list, read everything a run recorded,
abort, and delete a finished one. Reads need no token; create, abort and delete need a `write`
token. Request bodies are bounded (`limits` in the settings): size (413), nesting (422) and the
time they take to arrive (408, `middleware.BodyTimeout`). A created config's paths are resolved
and must stay in the settings' roots (`paths`, 422 naming the field); it is stored resolved.
Configs and event details are served with their secrets masked (`redact`)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool

from cascade.config import CascadeConfig, ConfigError, parse_cascade_json, parse_cascade_yaml
from cascade.store import control, removal, repo
from cascade.store.lifecycle import get_row
from cascade.store.models import Cascade
from services.api import queries, run_files, schemas
from services.api.deps import EngineDep, LimitsDep, WriterDep, unit_of_work
from services.api.paths import PathRoots, confine
from services.api.redact import redact
from services.api.settings import ApiLimits

router = APIRouter(prefix="/api/cascades", tags=["cascades"])
log = logging.getLogger("cascade.api")

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


def _check_storable(cfg: CascadeConfig, limits: ApiLimits) -> None:
    if len(cfg.name) > NAME_LIMITS["name"]:
        raise ConfigError(f"body: name: at most {NAME_LIMITS['name']} characters")
    cap = limits.max_stages_per_cascade
    if len(cfg.stages) > cap:
        raise ConfigError(
            f"body: stages: at most {cap} stages per cascade (the API's limits.max_stages_per_cascade), "
            f"got {len(cfg.stages)}"
        )
    for i, stage in enumerate(cfg.stages):
        label = stage.label
        if len(label) > NAME_LIMITS["stage"] or not label.isprintable():
            raise ConfigError(f"body: stages.{i}.name: at most {NAME_LIMITS['stage']} printable characters")


def _served(detail: schemas.CascadeOut) -> schemas.CascadeOut:
    """A cascade as anyone may read it: its config's secrets and its runs' outage causes masked."""
    runs = [r.model_copy(update={"degraded": redact(r.degraded)}) for r in detail.runs]
    return detail.model_copy(update={"config": redact(detail.config), "runs": runs})


def _parse_body(raw: bytes, content_type: str, limits: ApiLimits, roots: PathRoots) -> CascadeConfig:
    kind = content_type.split(";")[0].strip().lower() or "application/json"
    if kind not in YAML_TYPES and kind != "application/json":
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"send the config as application/json or application/yaml, not {kind!r}",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"body: not UTF-8 text (byte {err.start})") from None
    depth = limits.max_config_depth
    if kind in YAML_TYPES:
        cfg = parse_cascade_yaml(text, "body", max_depth=depth)
    else:
        cfg = parse_cascade_json(text, "body", max_depth=depth)
    _check_storable(cfg, limits)
    return confine(cfg, roots)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to exceed `limit` bytes (by its Content-Length,
    else while it streams in): a large body is never read to its end."""
    too_large = HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        f"request body larger than {limit} bytes (the API's limits.max_body_bytes)",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


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
        408: {"model": schemas.ErrorOut, "description": "body not received within limits.body_timeout_s"},
        413: {"model": schemas.ErrorOut, "description": "body larger than limits.max_body_bytes"},
        415: {"model": schemas.ErrorOut},
        422: {
            "model": schemas.ConfigErrorOut,
            "description": "invalid config; names the field, the bound it passed (nesting, stages), or "
            "the path that resolves outside the API's roots (paths)",
        },
    },
)
async def create_cascade(
    request: Request, engine: EngineDep, who: WriterDep, limits: LimitsDep
) -> schemas.CascadeOut:
    """Create a cascade and its pending stages (nothing runs until a stage is started). Its
    paths are resolved and must lie in the API's roots (`paths` in its settings); the config is
    stored with them resolved."""
    raw = await _read_body(request, limits.max_body_bytes)
    content_type = request.headers.get("content-type", "")
    # ConfigError -> 422 naming the field or the bound (app.py); parsed off the event loop
    cfg = await run_in_threadpool(_parse_body, raw, content_type, limits, request.app.state.paths)

    def create() -> schemas.CascadeOut:
        with unit_of_work(engine) as s:
            cascade = repo.create_cascade(s, name=cfg.name, config=cfg.model_dump(mode="json"))
            repo.create_stages(
                s, cascade_id=cascade.id, stages=[(st.label, st.domain_label) for st in cfg.stages]
            )
            repo.log_event(
                s, cascade_id=cascade.id, kind="created", actor=who.actor, detail={"stages": len(cfg.stages)}
            )
            s.flush()
            return _served(queries.cascade_detail(s, cascade.id))

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
    """The cascade, its stages and runs, and its config (secrets masked)."""
    with unit_of_work(engine) as s:
        return _served(queries.cascade_detail(s, cascade_id))


@router.delete(
    "/{cascade_id}",
    response_model=schemas.DeletedOut,
    responses={
        **_404,
        401: {"model": schemas.ErrorOut},
        403: {"model": schemas.ErrorOut},
        409: {
            "model": schemas.ConflictOut,
            "description": "the cascade is pending or running, a run of it is running, or a runner holds it",
        },
    },
)
def delete_cascade(cascade_id: Id, engine: EngineDep, who: WriterDep) -> schemas.DeletedOut:
    """Delete a completed, failed or aborted cascade with its stages, runs, metrics, evals,
    checkpoint rows and events, in one transaction (checkpoint files on disk stay)."""
    with unit_of_work(engine) as s:
        counts = removal.delete_cascade(s, cascade_id=cascade_id)
    log.info("cascade %d deleted by %s: %s", cascade_id, who.actor, counts)
    return schemas.DeletedOut(cascade_id=cascade_id, deleted=counts)


@router.get("/{cascade_id}/config", response_model=schemas.ConfigOut, responses=_404)
def get_config(cascade_id: Id, engine: EngineDep) -> schemas.ConfigOut:
    """The cascade's whole validated config as stored (paths resolved, secrets masked: the
    password of a URL, values of keys named like `token`, `password`, `secret`), and the hash of
    its training settings."""
    with unit_of_work(engine) as s:
        cascade = get_row(s, Cascade, cascade_id)
        config = redact(cascade.config) if isinstance(cascade.config, dict) else {}
        return schemas.ConfigOut(cascade_id=cascade.id, config=config, config_hash=cascade.config_hash)


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


@router.get("/{cascade_id}/completions", response_model=schemas.CompletionsOut, responses=_404)
def completions(
    cascade_id: Id,
    request: Request,
    engine: EngineDep,
    run_id: RunId = None,
    last: Annotated[int, Query(ge=1, le=200, description="how many of the latest")] = 20,
) -> schemas.CompletionsOut:
    """The latest completions the run logged (its run directory's `completions.jsonl`, oldest
    first): step, stage, domain, prompt and completion text, reward, verdict reason, finish
    reason, length. Read only from a run directory inside the API's runs root (`paths.runs_root`);
    none yet, or a directory elsewhere, is an empty list with a `note` saying why."""
    with unit_of_work(engine) as s:
        run = queries.pick_run(s, cascade_id, run_id)
        if run is None:
            return schemas.CompletionsOut(run_id=None, note="no run yet")
        found, output_dir = run.id, run.output_dir
    records, note = run_files.latest_completions(output_dir, request.app.state.paths, last)
    return schemas.CompletionsOut(run_id=found, completions=records, note=note)


@router.get("/{cascade_id}/events", response_model=list[schemas.EventOut], responses=_404)
def events(
    cascade_id: Id,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 200,
    after_id: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> list[schemas.EventOut]:
    """The append-only log: every transition and request and who asked (the latest `limit`;
    secrets in details masked)."""
    with unit_of_work(engine) as s:
        rows = queries.events(s, cascade_id, limit=limit, after_id=after_id)
    return [e.model_copy(update={"detail": redact(e.detail)}) for e in rows]


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

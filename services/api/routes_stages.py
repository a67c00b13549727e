"""Stage routes: read a stage, and the four operator commands (see `cascade.store.control`).

A stage is addressed by its global id (`/api/stages/{stage_id}/...`) or, as an operator thinks
of it, by its cascade and its name or index (`/api/cascades/{cascade_id}/stages/{stage}/...`):
the same commands, the same answers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from cascade.store import control
from cascade.store.lifecycle import get_row
from cascade.store.models import Stage
from services.api import queries, schemas
from services.api.deps import EngineDep, WriterDep, unit_of_work

router = APIRouter(prefix="/api/stages", tags=["stages"])
by_cascade = APIRouter(prefix="/api/cascades/{cascade_id}/stages", tags=["stages"])
StageId = Annotated[int, Path(ge=1, le=2**31 - 1, description="A stage's id (see GET /api/cascades/{id})")]
CascadeId = Annotated[int, Path(ge=1, le=2**31 - 1)]
StageRef = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        description="The stage's name (its `name`, else its domain) or its 0-based index in the cascade; "
        "a name wins over an index",
    ),
]

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": schemas.ErrorOut, "description": "no or invalid bearer token"},
    403: {"model": schemas.ErrorOut, "description": "read-only token"},
    404: {"model": schemas.ErrorOut, "description": "no such stage"},
    409: {"model": schemas.ConflictOut, "description": "illegal move; the body names the current state"},
}


@router.get("/{stage_id}", response_model=schemas.StageOut, responses={404: _ERRORS[404]})
def get_stage(stage_id: StageId, engine: EngineDep) -> schemas.StageOut:
    with unit_of_work(engine) as s:
        return queries.stage_out(get_row(s, Stage, stage_id))


def _command(engine: EngineDep, stage_id: int, command: str, actor: str) -> schemas.CommandOut:
    with unit_of_work(engine) as s:
        result = control.stage_command(s, stage_id=stage_id, command=command, actor=actor)
        return schemas.CommandOut(stage=queries.stage_out(result.stage), changed=result.changed)


@router.post("/{stage_id}/start", response_model=schemas.CommandOut, responses=_ERRORS)
def start(stage_id: StageId, engine: EngineDep, who: WriterDep) -> schemas.CommandOut:
    """pending -> running, at once; only the first unfinished stage, one active stage per cascade."""
    return _command(engine, stage_id, "start", who.actor)


@router.post("/{stage_id}/pause", response_model=schemas.CommandOut, responses=_ERRORS)
def pause(stage_id: StageId, engine: EngineDep, who: WriterDep) -> schemas.CommandOut:
    """Ask the runner to pause at its next step boundary, after writing a checkpoint."""
    return _command(engine, stage_id, "pause", who.actor)


@router.post("/{stage_id}/resume", response_model=schemas.CommandOut, responses=_ERRORS)
def resume(stage_id: StageId, engine: EngineDep, who: WriterDep) -> schemas.CommandOut:
    """Continue a paused stage from its checkpoint (or withdraw a pause not yet applied)."""
    return _command(engine, stage_id, "resume", who.actor)


@router.post("/{stage_id}/advance", response_model=schemas.CommandOut, responses=_ERRORS)
def advance(stage_id: StageId, engine: EngineDep, who: WriterDep) -> schemas.CommandOut:
    """End a running stage at its next step boundary; the cascade moves on to the next one."""
    return _command(engine, stage_id, "advance", who.actor)


def _command_in(engine: EngineDep, cascade_id: int, ref: str, command: str, actor: str) -> schemas.CommandOut:
    with unit_of_work(engine) as s:
        stage = queries.find_stage(s, cascade_id, ref)
        result = control.stage_command(s, stage_id=stage.id, command=command, actor=actor)
        return schemas.CommandOut(stage=queries.stage_out(result.stage), changed=result.changed)


@by_cascade.get("/{stage}", response_model=schemas.StageOut, responses={404: _ERRORS[404]})
def get_stage_in(cascade_id: CascadeId, stage: StageRef, engine: EngineDep) -> schemas.StageOut:
    """One stage of the cascade, by name or index."""
    with unit_of_work(engine) as s:
        return queries.stage_out(queries.find_stage(s, cascade_id, stage))


@by_cascade.post("/{stage}/start", response_model=schemas.CommandOut, responses=_ERRORS)
def start_in(cascade_id: CascadeId, stage: StageRef, engine: EngineDep, who: WriterDep) -> schemas.CommandOut:
    """`POST /api/stages/{stage_id}/start`, the stage named by its cascade and name or index."""
    return _command_in(engine, cascade_id, stage, "start", who.actor)


@by_cascade.post("/{stage}/pause", response_model=schemas.CommandOut, responses=_ERRORS)
def pause_in(cascade_id: CascadeId, stage: StageRef, engine: EngineDep, who: WriterDep) -> schemas.CommandOut:
    """`POST /api/stages/{stage_id}/pause`, the stage named by its cascade and name or index."""
    return _command_in(engine, cascade_id, stage, "pause", who.actor)


@by_cascade.post("/{stage}/resume", response_model=schemas.CommandOut, responses=_ERRORS)
def resume_in(
    cascade_id: CascadeId, stage: StageRef, engine: EngineDep, who: WriterDep
) -> schemas.CommandOut:
    """`POST /api/stages/{stage_id}/resume`, the stage named by its cascade and name or index."""
    return _command_in(engine, cascade_id, stage, "resume", who.actor)


@by_cascade.post("/{stage}/advance", response_model=schemas.CommandOut, responses=_ERRORS)
def advance_in(
    cascade_id: CascadeId, stage: StageRef, engine: EngineDep, who: WriterDep
) -> schemas.CommandOut:
    """`POST /api/stages/{stage_id}/advance`, the stage named by its cascade and name or index."""
    return _command_in(engine, cascade_id, stage, "advance", who.actor)

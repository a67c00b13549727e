"""Operator commands: what start, pause, resume, advance and abort mean for a cascade's stages.

The control plane's REST routes and any other operator tool call these; each is one locked
read-check-write in the caller's transaction, so a repeated command is a no-op (`changed` is
False) and a refused one raises `IllegalTransition` with the stage's current state (REST: 409).

- **start**: `pending -> running`, applied at once (no process owns a pending stage yet). Only the
  cascade's first unfinished stage may start, and only while no other stage is running or
  paused; the `uq_stages_one_active` index makes that hold even for two starts racing.
- **pause / resume / advance**: written as the stage's `desired_state`; the runner that owns the
  stage (`cascade run --db ...` or the distributed learner) applies it at its next step boundary
  (a pause right after writing a checkpoint). Resume also withdraws a pause not yet applied.
- **abort** (a cascade): pending and paused stages are aborted at once (nothing computes on
  them), a running stage is asked to abort at its next step boundary if a live runner holds the
  cascade's lease, else aborted at once too (a stalled run); the cascade is marked aborted, and
  runs with no running stage left are closed as aborted.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from cascade.store import leases
from cascade.store.lifecycle import (
    IllegalTransition,
    NotFound,
    finish_run,
    get_row,
    list_stages,
    locked_cascade,
    request_stage_state,
    set_cascade_status,
    transition_stage,
)
from cascade.store.models import TERMINAL_STAGE_STATES, Cascade, Run, Stage

STAGE_COMMANDS = ("start", "pause", "resume", "advance")


class OutOfOrder(IllegalTransition):
    """A later stage cannot start before the earlier ones have finished."""

    def __init__(self, current: str, *, blocking: Stage) -> None:
        super().__init__(current, "running")
        self.args = (f"stage {blocking.name!r} ({blocking.state}) must finish first: stages run in order",)


class AbortPending(IllegalTransition):
    """The stage is being aborted; no other request may replace that one."""

    def __init__(self, current: str, requested: str) -> None:
        super().__init__(current, requested)
        self.args = (f"stage is {current} with an abort pending: it cannot be moved to {requested}",)


@dataclass(frozen=True)
class CommandResult:
    stage: Stage
    changed: bool
    """False when the command was already in effect (a repeat)."""


def _locked(session: Session, stage_id: int, requested: str | None = None) -> Stage:
    stmt = (
        select(Stage).where(Stage.id == stage_id).with_for_update().execution_options(populate_existing=True)
    )
    stage = session.scalars(stmt).one_or_none()
    if stage is None:
        raise NotFound(f"stage {stage_id} does not exist")
    if requested is not None and stage.desired_state == "aborted":
        raise AbortPending(stage.state, requested)
    return stage


def _request(session: Session, stage: Stage, desired: str | None, actor: str, command: str) -> bool:
    before = stage.desired_state
    if desired is not None:
        request_stage_state(
            session, stage_id=stage.id, desired_state=desired, actor=actor, detail={"command": command}
        )
    return stage.desired_state != before


def start_stage(session: Session, *, stage_id: int, actor: str) -> CommandResult:
    stage = _locked(session, stage_id)
    if stage.state == "running":
        return CommandResult(stage, changed=False)
    if stage.state != "pending":
        raise IllegalTransition(stage.state, "running")
    for earlier in list_stages(session, cascade_id=stage.cascade_id):
        if earlier.index < stage.index and earlier.state not in TERMINAL_STAGE_STATES:
            raise OutOfOrder(stage.state, blocking=earlier)
    transition_stage(session, stage_id=stage.id, to_state="running", actor=actor, detail={"command": "start"})
    cascade = get_row(session, Cascade, stage.cascade_id)
    if cascade.status == "pending":
        set_cascade_status(session, cascade_id=cascade.id, status="running", actor=actor)
    return CommandResult(stage, changed=True)


def pause_stage(session: Session, *, stage_id: int, actor: str) -> CommandResult:
    stage = _locked(session, stage_id, "paused")
    if stage.state == "paused" or (stage.state == "running" and stage.desired_state == "paused"):
        return CommandResult(stage, changed=False)
    if stage.state != "running":
        raise IllegalTransition(stage.state, "paused")
    return CommandResult(stage, _request(session, stage, "paused", actor, "pause"))


def resume_stage(session: Session, *, stage_id: int, actor: str) -> CommandResult:
    stage = _locked(session, stage_id, "running")
    if stage.state == "running":
        # Withdraw a pause the runner has not applied yet; otherwise already running.
        desired = "running" if stage.desired_state == "paused" else None
        return CommandResult(stage, _request(session, stage, desired, actor, "resume"))
    if stage.state != "paused":
        raise IllegalTransition(stage.state, "running")
    return CommandResult(stage, _request(session, stage, "running", actor, "resume"))


def advance_stage(session: Session, *, stage_id: int, actor: str) -> CommandResult:
    """End the stage at the next step boundary as if its advance rule had fired."""
    stage = _locked(session, stage_id, "completed")
    if stage.state == "completed":
        return CommandResult(stage, changed=False)
    if stage.state != "running":
        raise IllegalTransition(stage.state, "completed")
    return CommandResult(stage, _request(session, stage, "completed", actor, "advance"))


def stage_command(session: Session, *, stage_id: int, command: str, actor: str) -> CommandResult:
    handlers = {"start": start_stage, "pause": pause_stage, "resume": resume_stage, "advance": advance_stage}
    if command not in handlers:
        raise ValueError(f"unknown stage command {command!r}; expected one of {', '.join(STAGE_COMMANDS)}")
    return handlers[command](session, stage_id=stage_id, actor=actor)


def abort_cascade(session: Session, *, cascade_id: int, actor: str) -> tuple[Cascade, bool]:
    """Abort every unfinished stage (see the module docstring); returns (cascade, changed)."""
    cascade = locked_cascade(session, cascade_id)
    if cascade.status in ("completed", "failed"):
        raise IllegalTransition(cascade.status, "aborted")
    changed = False
    still_running = False
    attached = leases.is_live(leases.lease_of(session, cascade_id), leases.db_now(session))
    for stage in list_stages(session, cascade_id=cascade_id):
        stage = _locked(session, stage.id)
        if stage.state in ("pending", "paused") or (stage.state == "running" and not attached):
            # no live runner to acknowledge a request (a stalled run): the abort applies now
            transition_stage(session, stage_id=stage.id, to_state="aborted", actor=actor)
            changed = True
        elif stage.state == "running":
            still_running = True
            changed |= _request(session, stage, "aborted", actor, "abort")
    if cascade.status != "aborted":
        set_cascade_status(session, cascade_id=cascade_id, status="aborted", actor=actor)
        changed = True
    if not still_running:
        for run in session.scalars(select(Run).where(Run.cascade_id == cascade_id, Run.status == "running")):
            finish_run(session, run_id=run.id, status="aborted", actor=actor)
            changed = True
    return cascade, changed

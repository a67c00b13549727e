"""Lifecycles: cascades, stages and runs are created and change state only through here.

The control plane (REST: 409 on a refused move), the embedded runner and the distributed
learner all use these functions, so one table of legal stage moves is enforced everywhere and
every change leaves an `events` row naming its actor. Operators do not move stages directly:
they write `desired_state`, and the process that owns the stage applies it at a step boundary.
`cascade.store.repo` re-exports the public names; import them from there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cascade.store.history import json_safe
from cascade.store.models import (
    ACTIVE_STAGE_STATES,
    CASCADE_STATUSES,
    RUN_KINDS,
    RUN_STATUSES,
    STAGE_STATES,
    TERMINAL_STAGE_STATES,
    Cascade,
    Checkpoint,
    Event,
    Run,
    Stage,
    utcnow,
)

_Row = TypeVar("_Row", Cascade, Stage, Run, Checkpoint)

ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"running", "aborted"}),
    "running": frozenset({"paused", "completed", "failed", "aborted"}),
    "paused": frozenset({"running", "aborted"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "aborted": frozenset(),
}


class IllegalTransition(Exception):
    """A state change the state machine forbids (the API answers 409)."""

    def __init__(self, current: str, requested: str) -> None:
        super().__init__(f"illegal transition {current} -> {requested}")
        self.current = current
        self.requested = requested


class StageBusy(IllegalTransition):
    """Another stage of the same cascade is running or paused (one active stage per cascade)."""

    def __init__(self, current: str, requested: str, *, active: str) -> None:
        super().__init__(current, requested)
        self.active = active
        self.args = (f"cannot start this stage: {active}",)


class NotFound(LookupError):
    """No row with that id (the API answers 404)."""


def check_choice(value: str, allowed: Iterable[str], what: str) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def get_row(session: Session, model: type[_Row], row_id: int) -> _Row:
    row = session.get(model, row_id)
    if row is None:
        raise NotFound(f"{model.__name__.lower()} {row_id} does not exist")
    return row


def log_event(
    session: Session,
    *,
    cascade_id: int,
    kind: str,
    actor: str,
    stage_id: int | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    detail: Mapping[str, Any] | None = None,
) -> Event:
    if not actor:
        raise ValueError("every event needs an actor")
    row = Event(
        cascade_id=cascade_id,
        stage_id=stage_id,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        actor=actor,
        detail=json_safe(dict(detail or {})),
    )
    session.add(row)
    return row


# --------------------------------------------------------------------------- cascades and stages


def create_cascade(session: Session, *, name: str, config: Mapping[str, Any] | Any) -> Cascade:
    """`config` is a `CascadeConfig` or its `model_dump(mode="json")`; its training settings'
    hash is stored beside it."""
    from cascade.config.diff import training_hash

    data = json_safe(config)
    row = Cascade(name=name, config=data, config_hash=training_hash(data), status="pending")
    session.add(row)
    session.flush()
    return row


def create_stages(session: Session, *, cascade_id: int, stages: Iterable[tuple[str, str]]) -> list[Stage]:
    """One `pending` stage per `(label, domain)`, indexed 0.. in order.

    From a config: `stages=[(s.label, s.domain_label) for s in config.stages]`.
    """
    get_row(session, Cascade, cascade_id)
    rows = [
        Stage(cascade_id=cascade_id, index=i, name=label, domain=domain, state="pending", steps_done=0)
        for i, (label, domain) in enumerate(stages)
    ]
    session.add_all(rows)
    session.flush()
    return rows


def list_stages(session: Session, *, cascade_id: int) -> list[Stage]:
    return list(session.scalars(select(Stage).where(Stage.cascade_id == cascade_id).order_by(Stage.index)))


def set_cascade_status(
    session: Session, *, cascade_id: int, status: str, actor: str, detail: Mapping[str, Any] | None = None
) -> Cascade:
    check_choice(status, CASCADE_STATUSES, "cascade status")
    row = get_row(session, Cascade, cascade_id)
    if row.status != status:
        log_event(
            session,
            cascade_id=cascade_id,
            kind="cascade_status",
            actor=actor,
            from_state=row.status,
            to_state=status,
            detail=detail,
        )
        row.status = status
    session.flush()
    return row


# --------------------------------------------------------------------------- stage state machine


def _locked_stage(session: Session, stage_id: int) -> Stage:
    # FOR UPDATE serialises the runner and the control plane on Postgres (SQLite omits it and
    # serialises writers by itself); populate_existing re-reads a row cached in this session.
    stmt = (
        select(Stage).where(Stage.id == stage_id).with_for_update().execution_options(populate_existing=True)
    )
    row = session.scalars(stmt).one_or_none()
    if row is None:
        raise NotFound(f"stage {stage_id} does not exist")
    return row


def locked_cascade(session: Session, cascade_id: int) -> Cascade:
    """The cascade row, locked for this transaction (as `_locked_stage`); `NotFound` if absent."""
    stmt = (
        select(Cascade)
        .where(Cascade.id == cascade_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    row = session.scalars(stmt).one_or_none()
    if row is None:
        raise NotFound(f"cascade {cascade_id} does not exist")
    return row


def transition_stage(
    session: Session, *, stage_id: int, to_state: str, actor: str, detail: Mapping[str, Any] | None = None
) -> Stage:
    """Move a stage along the state machine and log it; a move to the current state is a no-op.

    Raises `IllegalTransition(current, requested)` for a forbidden move. Reaching the state an
    operator asked for (or any terminal state) clears `desired_state`.
    """
    check_choice(to_state, STAGE_STATES, "stage state")
    stage = _locked_stage(session, stage_id)
    current = stage.state
    if to_state == current:
        return stage
    if to_state not in ALLOWED_TRANSITIONS[current]:
        raise IllegalTransition(current, to_state)
    if current == "pending" and to_state == "running":
        _check_no_active_sibling(session, stage)
    now = utcnow()
    if to_state == "running" and stage.started_at is None:
        stage.started_at = now
    if to_state in TERMINAL_STAGE_STATES:
        stage.ended_at = now
    if stage.desired_state == to_state or to_state in TERMINAL_STAGE_STATES:
        stage.desired_state = None
    stage.state = to_state
    log_event(
        session,
        cascade_id=stage.cascade_id,
        stage_id=stage.id,
        kind="transition",
        actor=actor,
        from_state=current,
        to_state=to_state,
        detail=detail,
    )
    try:
        session.flush()
    except IntegrityError as err:
        # The partial unique index caught a concurrent start that the check above could not see
        # (its row was not committed yet). The session must be rolled back by the caller.
        if "uq_stages_one_active" not in str(err.orig):
            raise
        raise StageBusy(current, to_state, active="another stage was started concurrently") from None
    return stage


def _check_no_active_sibling(session: Session, stage: Stage) -> None:
    active = session.scalars(
        select(Stage).where(
            Stage.cascade_id == stage.cascade_id,
            Stage.id != stage.id,
            Stage.state.in_(ACTIVE_STAGE_STATES),
        )
    ).first()
    if active is not None:
        raise StageBusy(stage.state, "running", active=f"stage {active.name!r} is {active.state}")


def request_stage_state(
    session: Session,
    *,
    stage_id: int,
    desired_state: str,
    actor: str,
    detail: Mapping[str, Any] | None = None,
) -> Stage:
    """Record what an operator wants (pause, resume, advance = completed, abort).

    The runner applies it at its next step boundary with `transition_stage`. A request the
    state machine could never satisfy raises `IllegalTransition` now, not later. Asking for
    the current state withdraws a pending request (resume cancels a pause not yet applied).
    """
    check_choice(desired_state, STAGE_STATES, "stage state")
    stage = _locked_stage(session, stage_id)
    if desired_state == stage.desired_state or (desired_state == stage.state and stage.desired_state is None):
        return stage
    if desired_state != stage.state and desired_state not in ALLOWED_TRANSITIONS[stage.state]:
        raise IllegalTransition(stage.state, desired_state)
    stage.desired_state = None if desired_state == stage.state else desired_state
    log_event(
        session,
        cascade_id=stage.cascade_id,
        stage_id=stage.id,
        kind="request",
        actor=actor,
        from_state=stage.state,
        to_state=desired_state,
        detail=detail,
    )
    session.flush()
    return stage


def requested_state(session: Session, *, stage_id: int) -> str | None:
    """The operator's pending request for a stage, read from the database (never a cached row)."""
    return session.scalar(select(Stage.desired_state).where(Stage.id == stage_id))


def list_events(session: Session, *, cascade_id: int, stage_id: int | None = None) -> list[Event]:
    stmt = select(Event).where(Event.cascade_id == cascade_id)
    if stage_id is not None:
        stmt = stmt.where(Event.stage_id == stage_id)
    return list(session.scalars(stmt.order_by(Event.id)))


# --------------------------------------------------------------------------- runs


def start_run(
    session: Session,
    *,
    cascade_id: int,
    seed: int,
    distill: bool,
    output_dir: str | Path,
    kind: str = "embedded",
    actor: str = "runner",
) -> Run:
    check_choice(kind, RUN_KINDS, "run kind")
    get_row(session, Cascade, cascade_id)
    row = Run(
        cascade_id=cascade_id,
        kind=kind,
        seed=seed,
        distill=distill,
        status="running",
        output_dir=str(output_dir),
    )
    session.add(row)
    session.flush()
    log_event(
        session,
        cascade_id=cascade_id,
        kind="run_started",
        actor=actor,
        to_state="running",
        detail={"run_id": row.id, "kind": kind, "seed": seed, "distill": distill},
    )
    session.flush()
    return row


def finish_run(
    session: Session,
    *,
    run_id: int,
    status: str = "completed",
    actor: str = "runner",
    detail: Mapping[str, Any] | None = None,
) -> Run:
    """Close a run as completed, failed or aborted; repeating the same status is a no-op."""
    check_choice(status, RUN_STATUSES[1:], "final run status")
    run = get_row(session, Run, run_id)
    if run.status == status:
        return run
    if run.status != "running":
        raise IllegalTransition(run.status, status)
    run.status = status
    run.ended_at = utcnow()
    log_event(
        session,
        cascade_id=run.cascade_id,
        kind="run_finished",
        actor=actor,
        from_state="running",
        to_state=status,
        detail={"run_id": run.id, **(detail or {})},
    )
    session.flush()
    return run

"""The only way the runner, the control plane and the learner write to the store.

Keyword-only functions over a caller-owned `Session` (they flush, never commit: the caller's
`session_scope` is the unit of work). They hold the rules a raw INSERT would skip: the stage
state machine and its event log (in `lifecycle`, re-exported here), one teacher per
(run, domain), JSON that both SQLite and Postgres accept. Queries return plain dataclasses
(`cascade.store.history`) so results outlive the session and the report needs no database.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from cascade.store.history import (
    EvalPoint,
    RegressionTable,
    RunHistory,
    StageSpan,
    StepPoint,
    build_regression_table,
    final_evals_by_stage,
    json_safe,
)
from cascade.store.lifecycle import (
    ALLOWED_TRANSITIONS,
    IllegalTransition,
    NotFound,
    StageBusy,
    check_choice,
    create_cascade,
    create_stages,
    finish_run,
    get_row,
    list_events,
    list_stages,
    log_event,
    request_stage_state,
    requested_state,
    set_cascade_status,
    start_run,
    transition_stage,
)
from cascade.store.models import (
    CHECKPOINT_KINDS,
    Cascade,
    Checkpoint,
    Eval,
    Run,
    Stage,
    Step,
)

__all__ = [
    "ALLOWED_TRANSITIONS",
    "ConflictingRow",
    "IllegalTransition",
    "NotFound",
    "StageBusy",
    "create_cascade",
    "create_stages",
    "discard_after",
    "eval_history",
    "finish_run",
    "latest_checkpoint",
    "list_events",
    "list_stages",
    "load_history",
    "mark_teacher",
    "record_checkpoint",
    "record_eval",
    "record_step",
    "regression_table",
    "request_stage_state",
    "requested_state",
    "set_cascade_status",
    "stage_final_evals",
    "start_run",
    "teachers",
    "transition_stage",
]


class ConflictingRow(ValueError):
    """A row written again with other values: not a repeated write but a second writer (e.g. a
    runner presumed dead whose write landed after another resumed the run)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} was stored already with other values: another runner wrote it")


def _run_and_stage(session: Session, run_id: int, stage_id: int) -> tuple[Run, Stage]:
    run = get_row(session, Run, run_id)
    stage = get_row(session, Stage, stage_id)
    if stage.cascade_id != run.cascade_id:
        raise ValueError(f"stage {stage_id} is not a stage of run {run_id}'s cascade")
    return run, stage


def record_step(
    session: Session, *, run_id: int, stage_id: int, step: int, global_step: int, metrics: Mapping[str, Any]
) -> tuple[Step, bool]:
    """Store one optimiser step's metrics (`step` counts updates in the stage, 1 = first); the
    row, and False when it was there already.

    Insert if absent: a write repeated after a lost reply (`cascade.runner.run_store`) finds its row and
    leaves it; the same step with other metrics is `ConflictingRow`. (Rows of steps redone after
    resuming from a checkpoint go first: `discard_after`.) The unique constraint on (run, stage,
    step) refuses a second row whatever the caller did.
    """
    _, stage = _run_and_stage(session, run_id, stage_id)
    existing = session.scalars(
        select(Step).where(Step.run_id == run_id, Step.stage_id == stage_id, Step.step == step)
    ).one_or_none()
    if existing is not None:
        if existing.global_step != global_step or existing.metrics != json_safe(dict(metrics)):
            raise ConflictingRow(f"step {step} of stage {stage_id} in run {run_id}")
        return existing, False
    row = Step(
        run_id=run_id, stage_id=stage_id, step=step, global_step=global_step, metrics=json_safe(dict(metrics))
    )
    session.add(row)
    stage.steps_done = max(stage.steps_done, step)
    session.flush()
    return row, True


def record_eval(
    session: Session,
    *,
    run_id: int,
    stage_id: int,
    step: int,
    global_step: int,
    domain: str,
    score: float,
    n: int,
    reasons: Mapping[str, int] | None = None,
    metrics: Mapping[str, Mapping[str, Any]] | None = None,
) -> Eval:
    """Store one domain's eval. The cascade's start is the eval at step 0 of the first stage.

    `metrics`: metric name -> {"value", "low", "high", "n", "method"} (see `Eval.metrics`).
    Insert if absent, as `record_step`: the (run, stage, step, domain) row already there is kept.
    """
    _run_and_stage(session, run_id, stage_id)
    existing = session.scalars(
        select(Eval).where(
            Eval.run_id == run_id, Eval.stage_id == stage_id, Eval.step == step, Eval.domain == domain
        )
    ).one_or_none()
    if existing is not None:
        if existing.score != json_safe(score) or existing.n != n:
            raise ConflictingRow(f"the {domain} eval at step {step} of stage {stage_id} in run {run_id}")
        return existing
    value = json_safe(score)
    if not isinstance(value, int | float):
        raise ValueError(f"eval score must be a finite number, got {score!r}")
    row = Eval(
        run_id=run_id,
        stage_id=stage_id,
        step=step,
        global_step=global_step,
        domain=domain,
        score=float(value),
        n=n,
        reasons=json_safe(dict(reasons or {})),
        metrics=None if metrics is None else json_safe({k: dict(v) for k, v in metrics.items()}),
    )
    session.add(row)
    session.flush()
    return row


def discard_after(session: Session, *, run_id: int, global_step: int) -> int:
    """Delete steps and evals past `global_step` (before resuming from a checkpoint there)."""
    deleted = 0
    for model in (Step, Eval):
        result = session.execute(delete(model).where(model.run_id == run_id, model.global_step > global_step))
        deleted += result.rowcount  # type: ignore[attr-defined]
    # the stages' step counters follow the rows, in the same transaction
    run = session.get(Run, run_id)
    if run is not None:
        for stage in session.scalars(select(Stage).where(Stage.cascade_id == run.cascade_id)):
            last = session.scalar(
                select(func.max(Step.step)).where(Step.run_id == run_id, Step.stage_id == stage.id)
            )
            stage.steps_done = int(last or 0)
    session.flush()
    return deleted


# --------------------------------------------------------------------------- checkpoints


def record_checkpoint(
    session: Session,
    *,
    run_id: int,
    stage_id: int,
    step: int,
    global_step: int,
    path: str | Path,
    kind: str,
    domain: str | None = None,
    score: float | None = None,
) -> Checkpoint:
    """One row per saved directory and domain: the same checkpoint recorded again (same run, stage,
    kind, step, path and domain: a repeated write, or a pause right after the periodic save) is the
    row already there. One directory may be several domains' teachers (their best checkpoints are
    one step's weights): a row each."""
    check_choice(kind, CHECKPOINT_KINDS, "checkpoint kind")
    _run_and_stage(session, run_id, stage_id)
    existing = session.scalars(
        select(Checkpoint)
        .where(
            Checkpoint.run_id == run_id,
            Checkpoint.stage_id == stage_id,
            Checkpoint.kind == kind,
            Checkpoint.global_step == global_step,
            Checkpoint.path == str(path),
            Checkpoint.domain.is_(None) if domain is None else Checkpoint.domain == domain,
        )
        .order_by(Checkpoint.id)
        .limit(1)
    ).first()
    if existing is not None:
        return existing
    row = Checkpoint(
        run_id=run_id,
        stage_id=stage_id,
        step=step,
        global_step=global_step,
        path=str(path),
        kind=kind,
        domain=domain,
        score=score,
        is_teacher=False,
    )
    session.add(row)
    session.flush()
    return row


def mark_teacher(
    session: Session, *, run_id: int, domain: str, checkpoint_id: int, actor: str = "runner"
) -> Checkpoint:
    """Make `checkpoint_id` the only teacher of `domain` in this run (no-op if it already is)."""
    ckpt = get_row(session, Checkpoint, checkpoint_id)
    if ckpt.run_id != run_id:
        raise ValueError(f"checkpoint {checkpoint_id} belongs to run {ckpt.run_id}, not {run_id}")
    if ckpt.domain not in (None, domain):
        raise ValueError(f"checkpoint {checkpoint_id} was scored on {ckpt.domain!r}, not {domain!r}")
    if ckpt.is_teacher:
        return ckpt
    previous = session.scalars(
        select(Checkpoint)
        .where(Checkpoint.run_id == run_id, Checkpoint.domain == domain, Checkpoint.is_teacher.is_(True))
        .with_for_update()
    ).one_or_none()
    if previous is not None:
        # Flushed on its own: the partial unique index must never see two teachers, whatever
        # order the unit of work would pick for the two UPDATEs.
        previous.is_teacher = False
        session.flush()
    ckpt.domain = domain
    ckpt.is_teacher = True
    run = get_row(session, Run, run_id)
    log_event(
        session,
        cascade_id=run.cascade_id,
        stage_id=ckpt.stage_id,
        kind="teacher",
        actor=actor,
        detail={
            "run_id": run_id,
            "domain": domain,
            "checkpoint_id": ckpt.id,
            "path": ckpt.path,
            "score": ckpt.score,
            "global_step": ckpt.global_step,
            "previous": None if previous is None else previous.id,
        },
    )
    session.flush()
    return ckpt


def teachers(session: Session, *, run_id: int) -> dict[str, Checkpoint]:
    """domain -> its teacher checkpoint (what to reload when resuming a run)."""
    rows = session.scalars(
        select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.is_teacher.is_(True))
    )
    return {row.domain: row for row in rows if row.domain is not None}


def latest_checkpoint(session: Session, *, run_id: int, kind: str = "resume") -> Checkpoint | None:
    check_choice(kind, CHECKPOINT_KINDS, "checkpoint kind")
    stmt = (
        select(Checkpoint)
        .where(Checkpoint.run_id == run_id, Checkpoint.kind == kind)
        .order_by(Checkpoint.global_step.desc(), Checkpoint.id.desc())
        .limit(1)
    )
    return session.scalars(stmt).first()


# --------------------------------------------------------------------------- report queries


def _eval_points(session: Session, run_id: int, index_of: Mapping[int, int]) -> list[EvalPoint]:
    rows = session.scalars(select(Eval).where(Eval.run_id == run_id).order_by(Eval.global_step, Eval.id))
    return [
        EvalPoint(
            index_of[e.stage_id],
            e.step,
            e.global_step,
            e.domain,
            e.score,
            e.n,
            dict(e.reasons or {}),
            dict(e.metrics or {}),
        )
        for e in rows
    ]


def load_history(session: Session, run_id: int) -> RunHistory:
    """The run's stages, steps and evals as plain data (the report's input)."""
    run = get_row(session, Run, run_id)
    cascade = get_row(session, Cascade, run.cascade_id)
    stages = list_stages(session, cascade_id=cascade.id)
    index_of = {s.id: s.index for s in stages}
    evals = _eval_points(session, run_id, index_of)
    steps = [
        StepPoint(index_of[stage_id], step, global_step, dict(metrics or {}))
        for stage_id, step, global_step, metrics in session.execute(
            select(Step.stage_id, Step.step, Step.global_step, Step.metrics)
            .where(Step.run_id == run_id)
            .order_by(Step.global_step, Step.id)
        )
    ]
    configured = cascade.config.get("domains", []) if isinstance(cascade.config, dict) else []
    domains = [d["name"] for d in configured if isinstance(d, dict) and isinstance(d.get("name"), str)]
    return RunHistory(
        stages=[StageSpan(s.index, s.name, s.domain, s.state) for s in stages],
        evals=evals,
        steps=steps,
        domains=domains,
        run_id=run.id,
        cascade_name=cascade.name,
        run_info={
            "kind": run.kind,
            "seed": run.seed,
            "distill": run.distill,
            "status": run.status,
            "started_at": run.started_at.isoformat(),
            "ended_at": run.ended_at.isoformat() if run.ended_at else None,
            "output_dir": run.output_dir,
        },
    )


def eval_history(session: Session, run_id: int) -> list[EvalPoint]:
    """Every eval of the run, ordered by global step then stage."""
    run = get_row(session, Run, run_id)
    stages = select(Stage.id, Stage.index).where(Stage.cascade_id == run.cascade_id)
    index_of = {stage_id: index for stage_id, index in session.execute(stages)}
    evals = _eval_points(session, run_id, index_of)
    return sorted(evals, key=lambda e: (e.global_step, e.stage_index, e.step, e.domain))


def stage_final_evals(session: Session, run_id: int) -> dict[int, dict[str, EvalPoint]]:
    """stage index -> domain -> the last eval of that domain within that stage."""
    return final_evals_by_stage(eval_history(session, run_id))


def regression_table(session: Session, run_id: int) -> RegressionTable:
    return build_regression_table(load_history(session, run_id))

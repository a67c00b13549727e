"""Read side of the API: ORM rows and `cascade.store` history turned into response bodies.

Every function takes the request's session; none writes. A cascade's metrics, evals,
checkpoints and tables are per run (an ablation has two): `run_id` picks one, else the latest.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cascade.config import LeaseConfig
from cascade.store import leases, repo
from cascade.store.history import EvalPoint
from cascade.store.lifecycle import NotFound, get_row
from cascade.store.models import (
    ACTIVE_STAGE_STATES,
    Cascade,
    Checkpoint,
    Event,
    Run,
    RunLease,
    Stage,
    Step,
)
from services.api import actions, schemas
from services.api.run_health import run_health


def _max_steps(cascade: Cascade, index: int) -> int | None:
    stages = cascade.config.get("stages") if isinstance(cascade.config, dict) else None
    try:
        value = stages[index]["advance"]["max_steps"]  # type: ignore[index]
    except (TypeError, KeyError, IndexError):
        return None
    return value if isinstance(value, int) else None


def stage_out(stage: Stage, cascade: Cascade | None = None) -> schemas.StageOut:
    cascade = cascade or stage.cascade
    return schemas.StageOut(
        id=stage.id,
        cascade_id=stage.cascade_id,
        index=stage.index,
        name=stage.name,
        domain=stage.domain,
        state=stage.state,
        desired_state=stage.desired_state,
        steps_done=stage.steps_done,
        max_steps=_max_steps(cascade, stage.index),
        started_at=stage.started_at,
        ended_at=stage.ended_at,
        actions=actions.stage_actions(stage),
    )


def run_out(
    run: Run,
    lease: RunLease | None = None,
    stages: list[Stage] | None = None,
    health_events: list[Event] | None = None,
    heartbeat_s: float = 5.0,
    *,
    now: datetime,
) -> schemas.RunOut:
    """The run as stored, with `stalled` derived from the cascade's lease: a running run whose
    stage is running but that no live runner holds, or whose stage is paused and whose runner
    died holding it (a runner that stopped cleanly at the pause released its lease)."""
    mine = lease if lease is not None and lease.run_id == run.id else None
    live = leases.is_live(mine, now)  # the database's clock: a writer's skew changes nothing
    status = run.status
    states = {s.state for s in stages or []}
    died_paused = "paused" in states and mine is not None
    if status == "running" and not live and ("running" in states or died_paused):
        status = "stalled"
    holder = None
    if live and mine is not None and run.status == "running":  # a closed run's runner is on its way out
        holder = f"{mine.host} pid {mine.pid} (since {mine.acquired_at:%Y-%m-%d %H:%M:%S} UTC)"
    return schemas.RunOut(
        id=run.id,
        kind=run.kind,
        seed=run.seed,
        distill=run.distill,
        status=status,
        started_at=run.started_at,
        ended_at=run.ended_at,
        output_dir=run.output_dir,
        holder=holder,
        heartbeat_at=mine.heartbeat_at if mine is not None else None,
        **_health(run, mine if holder is not None else None, health_events or [], heartbeat_s, now),
    )


def _health(
    run: Run, live: RunLease | None, events: list[Event], heartbeat_s: float, now: datetime
) -> dict[str, Any]:
    degraded, outages = run_health(run.id, events, live, heartbeat_s=heartbeat_s, now=now)
    age = None if live is None else round((now - live.heartbeat_at).total_seconds(), 1)
    return {"degraded": degraded, "outages": outages, "heartbeat_age_s": age}


def _heartbeat_s(cascade: Cascade) -> float:
    lease = cascade.config.get("lease") if isinstance(cascade.config, dict) else None
    value = lease.get("heartbeat_s") if isinstance(lease, dict) else None
    return float(value) if isinstance(value, int | float) else LeaseConfig().heartbeat_s


def cascade_summary(session: Session, cascade: Cascade) -> schemas.CascadeSummary:
    stages = repo.list_stages(session, cascade_id=cascade.id)
    active = next((s.name for s in stages if s.state in ACTIVE_STAGE_STATES), None)
    return schemas.CascadeSummary(
        id=cascade.id,
        name=cascade.name,
        status=cascade.status,
        created_at=cascade.created_at,
        stages=len(stages),
        active_stage=active,
    )


def list_cascades(session: Session, *, limit: int, offset: int) -> list[schemas.CascadeSummary]:
    rows = session.scalars(select(Cascade).order_by(Cascade.id.desc()).limit(limit).offset(offset))
    return [cascade_summary(session, c) for c in rows]


def cascade_detail(session: Session, cascade_id: int) -> schemas.CascadeOut:
    cascade = get_row(session, Cascade, cascade_id)
    runs = list(session.scalars(select(Run).where(Run.cascade_id == cascade_id).order_by(Run.id)))
    stage_rows = repo.list_stages(session, cascade_id=cascade_id)
    lease = leases.lease_of(session, cascade_id)
    now = leases.db_now(session)
    offered = actions.cascade_actions(cascade, stage_rows, runs, runner_live=leases.is_live(lease, now))
    health = list(
        session.scalars(
            select(Event)
            .where(Event.cascade_id == cascade_id, Event.kind.in_(("outage", "degraded")))
            .order_by(Event.id)
        )
    )
    return schemas.CascadeOut(
        id=cascade.id,
        name=cascade.name,
        status=cascade.status,
        created_at=cascade.created_at,
        config=cascade.config if isinstance(cascade.config, dict) else {},
        stages=[stage_out(s, cascade) for s in stage_rows],
        runs=[run_out(r, lease, stage_rows, health, _heartbeat_s(cascade), now=now) for r in runs],
        actions=offered,
    )


def find_stage(session: Session, cascade_id: int, ref: str) -> Stage:
    """A cascade's stage by name, else by 0-based index (a stage named "1" wins over index 1)."""
    get_row(session, Cascade, cascade_id)
    stages = repo.list_stages(session, cascade_id=cascade_id)
    for stage in stages:
        if stage.name == ref:
            return stage
    if ref.isascii() and ref.isdigit():
        for stage in stages:
            if stage.index == int(ref):
                return stage
    names = ", ".join(s.name for s in stages[:20]) + (", ..." if len(stages) > 20 else "")
    raise NotFound(f"cascade {cascade_id} has no stage named {ref!r} nor at that index (its stages: {names})")


def pick_run(session: Session, cascade_id: int, run_id: int | None) -> Run | None:
    """The run asked for (404 if it is not this cascade's), else the cascade's latest, else None."""
    get_row(session, Cascade, cascade_id)
    if run_id is not None:
        run = session.get(Run, run_id)
        if run is None or run.cascade_id != cascade_id:
            raise NotFound(f"run {run_id} is not a run of cascade {cascade_id}")
        return run
    return session.scalars(select(Run).where(Run.cascade_id == cascade_id).order_by(Run.id.desc())).first()


def metrics(
    session: Session, cascade_id: int, run_id: int | None, *, after_global_step: int, limit: int
) -> schemas.MetricsOut:
    run = pick_run(session, cascade_id, run_id)
    if run is None:
        return schemas.MetricsOut(run_id=None, steps=[])
    index_of = dict(
        session.execute(select(Stage.id, Stage.index).where(Stage.cascade_id == cascade_id)).all()
    )
    rows = session.execute(
        select(Step.stage_id, Step.step, Step.global_step, Step.metrics)
        .where(Step.run_id == run.id, Step.global_step > after_global_step)
        .order_by(Step.global_step, Step.id)
        .limit(limit)
    )
    steps = [
        schemas.StepOut(stage_index=index_of[sid], step=st, global_step=g, metrics=dict(m or {}))
        for sid, st, g, m in rows
    ]
    return schemas.MetricsOut(run_id=run.id, steps=steps)


def evals(session: Session, cascade_id: int, run_id: int | None) -> schemas.EvalsOut:
    run = pick_run(session, cascade_id, run_id)
    if run is None:
        return schemas.EvalsOut(run_id=None, evals=[])
    points = repo.eval_history(session, run.id)
    return schemas.EvalsOut(run_id=run.id, evals=[_eval_out(e) for e in points])


def _eval_out(e: EvalPoint) -> schemas.EvalOut:
    ci = e.interval()
    return schemas.EvalOut(
        stage_index=e.stage_index,
        step=e.step,
        global_step=e.global_step,
        domain=e.domain,
        score=e.score,
        n=e.n,
        reasons=dict(e.reasons),
        low=None if ci is None else ci[0],
        high=None if ci is None else ci[1],
        metrics={k: schemas.MetricOut(**v) for k, v in e.metrics.items()},
    )


def checkpoints(session: Session, cascade_id: int, run_id: int | None) -> list[schemas.CheckpointOut]:
    run = pick_run(session, cascade_id, run_id)
    if run is None:
        return []
    rows = session.scalars(
        select(Checkpoint).where(Checkpoint.run_id == run.id).order_by(Checkpoint.global_step, Checkpoint.id)
    )
    return [
        schemas.CheckpointOut(
            id=c.id,
            run_id=c.run_id,
            stage_id=c.stage_id,
            step=c.step,
            global_step=c.global_step,
            path=c.path,
            kind=c.kind,
            domain=c.domain,
            score=c.score,
            is_teacher=c.is_teacher,
            created_at=c.created_at,
        )
        for c in rows
    ]


def regression(session: Session, cascade_id: int, run_id: int | None) -> schemas.RegressionOut:
    run = pick_run(session, cascade_id, run_id)
    if run is None:
        stages = repo.list_stages(session, cascade_id=cascade_id)
        return schemas.RegressionOut(run_id=None, stages=[s.name for s in stages], rows=[])
    table = repo.regression_table(session, run.id).to_dict()
    return schemas.RegressionOut(
        run_id=run.id,
        units=table["units"],
        metric=table["metric"],
        noise_rule=table["noise_rule"],
        stages=table["stages"],
        rows=[schemas.RegressionRowOut(**row) for row in table["rows"]],
    )


def reasons(session: Session, cascade_id: int, run_id: int | None) -> schemas.ReasonsOut:
    run = pick_run(session, cascade_id, run_id)
    if run is None:
        return schemas.ReasonsOut(run_id=None)
    name_of = dict(session.execute(select(Stage.id, Stage.name).where(Stage.cascade_id == cascade_id)).all())
    training: dict[str, Counter[str]] = {}
    for stage_id, m in session.execute(select(Step.stage_id, Step.metrics).where(Step.run_id == run.id)):
        counts = (m or {}).get("reasons")
        bucket = training.setdefault(name_of[stage_id], Counter())
        if isinstance(counts, dict):
            bucket.update({str(k): int(v) for k, v in counts.items() if isinstance(v, int | float)})
    latest: dict[str, dict[str, int]] = {}
    for e in repo.eval_history(session, run.id):
        latest[e.domain] = dict(e.reasons)
    return schemas.ReasonsOut(run_id=run.id, training={k: dict(v) for k, v in training.items()}, eval=latest)


def events(session: Session, cascade_id: int, *, limit: int, after_id: int) -> list[schemas.EventOut]:
    get_row(session, Cascade, cascade_id)
    rows = session.scalars(
        select(Event)
        .where(Event.cascade_id == cascade_id, Event.id > after_id)
        .order_by(Event.id.desc())
        .limit(limit)
    )
    out = [
        schemas.EventOut(
            id=e.id,
            stage_id=e.stage_id,
            at=e.at,
            kind=e.kind,
            from_state=e.from_state,
            to_state=e.to_state,
            actor=e.actor,
            detail=dict(e.detail or {}),
        )
        for e in rows
    ]
    return out[::-1]


def schema_revision(session: Session) -> str | None:
    try:
        return session.scalar(select(func.max(_alembic_version_num())))
    except Exception:  # noqa: BLE001 - a SQLite run database has no alembic_version table
        session.rollback()
        return None


def _alembic_version_num() -> Any:
    from sqlalchemy import column, table

    return table("alembic_version", column("version_num")).c.version_num

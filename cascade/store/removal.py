"""Deleting a finished cascade: every row under it, in the caller's one transaction.

Only a cascade nothing works on may go: its status is completed, failed or aborted, none of
its runs is still `running` (an aborted cascade's runner stops at its next step boundary and
closes its run then) and no live runner holds its lease. Anything else is refused with
`DeleteRefused` (REST: 409) and leaves no trace.

The rows are deleted explicitly, children first, rather than trusting `ON DELETE CASCADE`
alone: the result is the same on Postgres and on a SQLite connection without foreign keys on,
and the counts say what went.
"""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from cascade.store import leases
from cascade.store.lifecycle import IllegalTransition, locked_cascade
from cascade.store.models import Cascade, Checkpoint, Eval, Event, Run, RunLease, Stage, Step

DELETABLE_STATUSES = ("completed", "failed", "aborted")


class DeleteRefused(IllegalTransition):
    """The cascade is still (or may still be) worked on."""

    def __init__(self, current: str, why: str) -> None:
        super().__init__(current, "deleted")
        self.args = (why,)


def delete_cascade(session: Session, *, cascade_id: int) -> dict[str, int]:
    """Delete the cascade and its stages, runs, steps, evals, checkpoints, events and lease;
    returns how many rows of each went. Locks the cascade row first, so a runner joining at the
    same moment waits and then finds it gone."""
    cascade = locked_cascade(session, cascade_id)
    if cascade.status not in DELETABLE_STATUSES:
        raise DeleteRefused(
            cascade.status,
            f"cascade {cascade_id} is {cascade.status}: only a completed, failed or aborted cascade "
            "can be deleted (abort it first)",
        )
    running = session.scalars(
        select(Run.id).where(Run.cascade_id == cascade_id, Run.status == "running").order_by(Run.id)
    ).first()
    if running is not None:
        raise DeleteRefused(
            "running",
            f"cascade {cascade_id}'s run {running} is still running: it stops at its next step "
            "boundary (a stalled one: abort the cascade, then delete)",
        )
    lease = leases.lease_of(session, cascade_id)
    if leases.is_live(lease, leases.db_now(session)):
        assert lease is not None
        raise DeleteRefused(
            cascade.status,
            f"cascade {cascade_id} is held by a live runner ({lease.host} pid {lease.pid}, since "
            f"{lease.acquired_at:%Y-%m-%d %H:%M:%S} UTC)",
        )
    run_ids = select(Run.id).where(Run.cascade_id == cascade_id)
    counts: dict[str, int] = {}
    for name, stmt in (
        ("events", delete(Event).where(Event.cascade_id == cascade_id)),
        ("checkpoints", delete(Checkpoint).where(Checkpoint.run_id.in_(run_ids))),
        ("evals", delete(Eval).where(Eval.run_id.in_(run_ids))),
        ("steps", delete(Step).where(Step.run_id.in_(run_ids))),
        ("leases", delete(RunLease).where(RunLease.cascade_id == cascade_id)),
        ("runs", delete(Run).where(Run.cascade_id == cascade_id)),
        ("stages", delete(Stage).where(Stage.cascade_id == cascade_id)),
        ("cascades", delete(Cascade).where(Cascade.id == cascade_id)),
    ):
        result = session.execute(stmt.execution_options(synchronize_session=False))
        counts[name] = int(getattr(result, "rowcount", 0) or 0)
    session.expunge(cascade)
    return counts

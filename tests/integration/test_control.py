"""Operator commands at the database level: the race the lifecycle's own check cannot see.

Two transactions starting two stages of one cascade at the same moment both find no active
stage (neither has committed); the partial unique index `uq_stages_one_active` makes the second
wait for the first and then fail, surfaced as `StageBusy` (REST: 409), never two running stages.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cascade.store import control, leases, repo
from cascade.store.db import make_engine, prepare_schema, session_scope
from cascade.store.leases import Holder
from cascade.store.models import Run, Stage


@pytest.mark.postgres
def test_two_concurrent_starts_cannot_both_win(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    prepare_schema(engine)
    with session_scope(engine) as s:
        cascade = repo.create_cascade(s, name="race", config={"name": "race"})
        a, b = repo.create_stages(s, cascade_id=cascade.id, stages=[("a", "math"), ("b", "code")])
        ids = cascade.id, a.id, b.id
    first = Session(engine)
    repo.transition_stage(first, stage_id=ids[1], to_state="running", actor="one")  # flushed, not committed
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with session_scope(engine) as s:
                repo.transition_stage(s, stage_id=ids[2], to_state="running", actor="two")
        except BaseException as err:  # noqa: BLE001 - inspected below
            errors.append(err)

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # blocked on the index entry of the uncommitted first start
    first.commit()
    first.close()
    thread.join(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], repo.StageBusy), errors
    assert str(errors[0]) == "cannot start this stage: another stage was started concurrently"
    with session_scope(engine) as s:
        mine = select(func.count()).select_from(Stage).where(Stage.cascade_id == ids[0])
        running = s.scalar(mine.where(Stage.state == "running"))
        assert running == 1
        with pytest.raises(repo.StageBusy, match="stage 'a' is running"):
            repo.transition_stage(s, stage_id=ids[2], to_state="running", actor="three")
    engine.dispose()


def test_commands_on_sqlite_too(sqlite_url: str) -> None:
    """The embedded runner's SQLite store enforces the same commands (no API in between)."""
    engine = make_engine(sqlite_url)
    prepare_schema(engine)
    with session_scope(engine) as s:
        cascade = repo.create_cascade(s, name="t", config={"name": "t"})
        a, b = repo.create_stages(s, cascade_id=cascade.id, stages=[("a", "math"), ("b", "code")])
        with pytest.raises(control.OutOfOrder, match="stage 'a' \\(pending\\) must finish first"):
            control.start_stage(s, stage_id=b.id, actor="op")
        assert control.start_stage(s, stage_id=a.id, actor="op").changed
        assert not control.start_stage(s, stage_id=a.id, actor="op").changed
        assert control.pause_stage(s, stage_id=a.id, actor="op").stage.desired_state == "paused"
        with pytest.raises(ValueError, match="unknown stage command 'stop'"):
            control.stage_command(s, stage_id=a.id, command="stop", actor="op")
        # a live runner holds the cascade: the running stage is asked to abort at its next step
        leases.acquire(s, cascade_id=cascade.id, run_id=None, holder=Holder("t0k", "h", 1), expiry_s=60)
        cascade_row, changed = control.abort_cascade(s, cascade_id=cascade.id, actor="op")
        assert changed and cascade_row.status == "aborted"
        assert [(st.state, st.desired_state) for st in repo.list_stages(s, cascade_id=cascade.id)] == [
            ("running", "aborted"), ("aborted", None),
        ]  # fmt: skip
        with pytest.raises(control.AbortPending):
            control.resume_stage(s, stage_id=a.id, actor="op")
    engine.dispose()


def test_abort_without_a_live_runner_applies_at_once(sqlite_url: str) -> None:
    """No runner will read a request (none attached, or its lease expired: a stalled run): the
    abort moves the running stage and the run to aborted now, never 'running, abort requested'."""
    from datetime import timedelta

    from cascade.store.models import RunLease

    engine = make_engine(sqlite_url)
    prepare_schema(engine)
    with session_scope(engine) as s:
        cascade = repo.create_cascade(s, name="t", config={"name": "t"})
        a, b = repo.create_stages(s, cascade_id=cascade.id, stages=[("a", "math"), ("b", "code")])
        control.start_stage(s, stage_id=a.id, actor="op")
        run = repo.start_run(s, cascade_id=cascade.id, seed=0, distill=True, output_dir="x")
        lease = leases.acquire(
            s, cascade_id=cascade.id, run_id=run.id, holder=Holder("t0k", "h", 1), expiry_s=60
        )
        lease.expires_at = lease.heartbeat_at - timedelta(seconds=1)  # the runner stopped beating
        s.flush()
        assert not leases.is_live(s.get(RunLease, cascade.id), leases.db_now(s))
        _, changed = control.abort_cascade(s, cascade_id=cascade.id, actor="op")
        assert changed
        assert [(st.state, st.desired_state) for st in repo.list_stages(s, cascade_id=cascade.id)] == [
            ("aborted", None), ("aborted", None),
        ]  # fmt: skip
        assert s.get(Run, run.id).status == "aborted"
    engine.dispose()

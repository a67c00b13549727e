"""The runner's store rides out database outages: which errors are retried, and every write is
idempotent when a commit took effect but its reply was lost. A real SQLite store; the faults are
raised from SQLAlchemy's own event hooks (a real Postgres restarted during a run:
tests/e2e/test_database_outage.py)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import IntegrityError, OperationalError

from cascade.config import CascadeConfig
from cascade.eval.results import DomainEval
from cascade.resilience import DependencyDown
from cascade.runner.run_store import RunStore
from cascade.store import db
from cascade.store.leases import Holder
from cascade.store.models import Checkpoint, Eval, Event, Run, Step
from cascade.store.repo import ConflictingRow
from cascade.store.transient import is_transient

CONFIG = {
    "name": "blip",
    "model": {"path": "models/tiny"},
    "domains": [{"name": "math"}],
    "stages": [{"domain": "math", "advance": {"max_steps": 3}}],
}


def _wrapped(orig: BaseException) -> OperationalError:
    return OperationalError("SELECT 1", {}, orig)


def test_dropped_refused_and_restarting_servers_are_transient_bugs_are_not() -> None:
    assert is_transient(_wrapped(psycopg.OperationalError("connection refused")))  # no SQLSTATE
    assert is_transient(_wrapped(psycopg.errors.AdminShutdown("terminating connection")))
    assert is_transient(_wrapped(psycopg.errors.CannotConnectNow("the database system is starting up")))
    assert is_transient(_wrapped(sqlite3.OperationalError("database is locked")))
    assert not is_transient(_wrapped(sqlite3.OperationalError("no such table: steps")))
    assert not is_transient(_wrapped(psycopg.errors.UndefinedTable("relation does not exist")))
    assert not is_transient(ConnectionError("not a database error"))
    invalidated = _wrapped(sqlite3.OperationalError("whatever"))
    invalidated.connection_invalidated = True
    assert is_transient(invalidated)


def test_a_refused_postgres_connect_is_transient() -> None:
    engine = db.make_engine("postgresql://nobody@127.0.0.1:1/nothing", connect_args={"connect_timeout": 2})
    try:
        with pytest.raises(OperationalError) as err:
            engine.connect()
        assert is_transient(err.value)
    finally:
        engine.dispose()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    logs: list[str] = []
    s = RunStore(f"sqlite:///{tmp_path / 'c.db'}", give_up_after_s=5.0, log=logs.append)
    s.database.first_delay_s = 0.01
    s.logs = logs  # type: ignore[attr-defined]
    s.begin(
        CascadeConfig.model_validate(CONFIG),
        run_dir=tmp_path,
        distill=False,
        holder=Holder.this_process(uuid.uuid4().hex),
    )
    yield s
    s.engine.dispose()


@contextmanager
def failing_statements(store: RunStore, n: int, message: str = "database is locked") -> Iterator[None]:
    """The next `n` statements fail as a locked (or dropped) database would."""
    left = {"n": n}

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if left["n"] > 0:
            left["n"] -= 1
            raise sqlite3.OperationalError(message)

    event.listen(store.engine, "before_cursor_execute", before)
    try:
        yield
    finally:
        event.remove(store.engine, "before_cursor_execute", before)


@contextmanager
def lost_commit_replies(store: RunStore, n: int) -> Iterator[None]:
    """The next `n` commits take effect, then fail as a connection dropped before the reply."""
    left = {"n": n}

    def commit(conn: Any) -> None:
        if left["n"] > 0:
            left["n"] -= 1
            conn.connection.dbapi_connection.commit()
            raise _wrapped(psycopg.OperationalError("server closed the connection unexpectedly"))

    event.listen(store.engine, "commit", commit)
    try:
        yield
    finally:
        event.remove(store.engine, "commit", commit)


def count(store: RunStore, model: type, **where: Any) -> int:
    with db.session_scope(store.engine) as s:
        stmt = select(func.count()).select_from(model)
        for key, value in where.items():
            stmt = stmt.where(getattr(model, key) == value)
        return int(s.scalar(stmt) or 0)


def test_a_locked_database_is_retried_and_the_outage_counted_once(store: RunStore) -> None:
    with failing_statements(store, 3):
        store.record_step(0, 1, 1, {"loss": 1.0})
    assert count(store, Step) == 1
    stats = store.database.stats
    assert (stats.outages, stats.retries) == (1, 3) and stats.down_s > 0
    assert store.logs[0].startswith("database unreachable (OperationalError: (sqlite3.OperationalError)")  # type: ignore[attr-defined]
    assert store.logs[1].startswith("database back after")  # type: ignore[attr-defined]
    # the next step's row carries the outage as an event, once
    store.record_step(0, 2, 2, {"loss": 0.5})
    store.record_step(0, 3, 3, {"loss": 0.2})
    with db.session_scope(store.engine) as s:
        events = [e.detail for e in s.scalars(select(Event).where(Event.kind == "outage"))]
    assert len(events) == 1
    assert events[0]["dependency"] == "database" and events[0]["outages"] == 1
    assert events[0]["run_id"] == store.run_id and events[0]["down_s"] > 0
    assert "database is locked" in events[0]["cause"]


def test_writes_whose_reply_was_lost_do_not_duplicate(store: RunStore, tmp_path: Path) -> None:
    with lost_commit_replies(store, 1):
        store.stage_started(0)
    with lost_commit_replies(store, 1):
        store.record_step(0, 1, 1, {"loss": 1.0})
    with lost_commit_replies(store, 1):
        store.record_eval(0, 1, 1, DomainEval(domain="math", score=0.5, n=4, reasons={"ok": 2}))
    with lost_commit_replies(store, 1):
        store.record_checkpoint(0, 1, 1, tmp_path / "step-000001")
    with lost_commit_replies(store, 1):
        store.record_teacher(0, 1, 1, domain="math", score=0.5, path=tmp_path / "math-g000001")
    with lost_commit_replies(store, 1):
        store.stage_completed(0, stopped_by="max_steps", steps=1)
    with lost_commit_replies(store, 1):
        store.finish("completed")
    assert count(store, Step) == 1 and count(store, Eval) == 1
    assert count(store, Checkpoint, kind="resume") == 1 and count(store, Checkpoint, kind="teacher") == 1
    assert count(store, Event, kind="teacher") == 1 and count(store, Event, kind="run_finished") == 1
    assert count(store, Event, kind="transition") == 2  # pending -> running -> completed
    assert store.database.stats.outages == 7


def test_the_same_row_with_other_values_is_a_second_writer_not_a_retry(store: RunStore) -> None:
    store.record_step(0, 1, 1, {"loss": 1.0, "nan": float("nan")})
    store.record_step(0, 1, 1, {"loss": 1.0, "nan": float("nan")})  # a repeat: the row stays
    with pytest.raises(ConflictingRow, match="step 1 of stage .* another runner wrote it"):
        store.record_step(0, 1, 1, {"loss": 0.5})
    store.record_eval(0, 1, 1, DomainEval(domain="math", score=0.5, n=4, reasons={}))
    with pytest.raises(ConflictingRow, match="math eval at step 1"):
        store.record_eval(0, 1, 1, DomainEval(domain="math", score=0.25, n=4, reasons={}))
    assert count(store, Step) == 1 and count(store, Eval) == 1


def test_a_begin_whose_reply_was_lost_makes_one_run(tmp_path: Path) -> None:
    s = RunStore(f"sqlite:///{tmp_path / 'c.db'}", give_up_after_s=5.0, log=lambda _: None)
    s.database.first_delay_s = 0.01
    with lost_commit_replies(s, 1):
        ids = s.begin(
            CascadeConfig.model_validate(CONFIG),
            run_dir=tmp_path,
            distill=False,
            holder=Holder.this_process(uuid.uuid4().hex),
        )
    assert count(s, Run) == 1 and ids["run_id"] == s.run_id
    s.engine.dispose()


def test_errors_that_are_not_outages_are_raised_at_once(store: RunStore) -> None:
    with failing_statements(store, 1, "no such table: steps"), pytest.raises(OperationalError):
        store.record_step(0, 1, 1, {})
    assert store.database.stats.outages == 0
    # the constraint still refuses a second row written behind the repository's back
    with pytest.raises(IntegrityError), db.session_scope(store.engine) as s:
        for _ in range(2):
            s.add(Step(run_id=store.run_id, stage_id=store.stage_ids[0], step=1, global_step=1, metrics={}))
        s.flush()


def test_past_the_bound_the_store_raises_dependency_down(store: RunStore) -> None:
    store.database.give_up_after_s = 0.2
    with failing_statements(store, 10**6), pytest.raises(DependencyDown) as err:
        store.desired_state(0)
    assert err.value.name == "database" and "database is locked" in str(err.value)
    assert "\n" not in str(err.value)

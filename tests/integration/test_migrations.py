"""Alembic migrations from an empty database produce exactly the models' schema.

The control plane migrates Postgres at start-up and the embedded runner creates SQLite files
with `create_all`; both must describe the same tables, so the migrated schema is compared with
`Base.metadata` by Alembic's own autogenerate diff (no difference allowed), on both backends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from cascade.store import migrate, repo
from cascade.store.db import make_engine, prepare_schema, session_scope
from cascade.store.models import Base


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    eng = make_engine(request.getfixturevalue(f"{request.param}_url"))
    yield eng
    eng.dispose()


def _diff(engine: Engine) -> list:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, Base.metadata))


def test_upgrade_from_empty_matches_models(empty_engine: Engine) -> None:
    assert inspect(empty_engine).get_table_names() == []
    assert migrate.current_revision(empty_engine) is None
    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    assert _diff(empty_engine) == []
    tables = set(inspect(empty_engine).get_table_names())
    assert tables == set(Base.metadata.tables) | {"alembic_version"}


def test_upgrade_is_idempotent_and_downgrade_empties(empty_engine: Engine) -> None:
    migrate.upgrade(empty_engine)
    migrate.upgrade(empty_engine)  # already at head: nothing to do
    migrate.downgrade(empty_engine, "base")
    assert set(inspect(empty_engine).get_table_names()) <= {"alembic_version"}
    migrate.upgrade(empty_engine)
    assert _diff(empty_engine) == []


def test_migrated_schema_keeps_the_guards(empty_engine: Engine) -> None:
    """The partial unique indexes exist after migrating: one active stage per cascade."""
    prepare_schema(empty_engine)
    with session_scope(empty_engine) as s:
        cascade = repo.create_cascade(s, name="m", config={"name": "m"})
        a, b = repo.create_stages(s, cascade_id=cascade.id, stages=[("a", "math"), ("b", "code")])
        repo.transition_stage(s, stage_id=a.id, to_state="running", actor="t")
        ids = a.id, b.id
    with pytest.raises(IntegrityError, match="uq_stages_one_active|UNIQUE constraint failed"):
        with empty_engine.begin() as conn:  # behind the lifecycle's back: the index still refuses
            conn.execute(text("UPDATE stages SET state = 'paused' WHERE id = :id"), {"id": ids[1]})


@pytest.mark.postgres
def test_wait_for_database_names_the_url() -> None:
    eng = make_engine("postgresql://nobody@127.0.0.1:1/nothing")
    with pytest.raises(migrate.DatabaseUnavailable, match=r"127\.0\.0\.1:1/nothing.*within 0\.2s"):
        migrate.wait_for_database(eng, timeout_s=0.2, interval_s=0.05)

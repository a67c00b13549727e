"""Engines and sessions for the store, with the per-backend settings in one place.

SQLite (embedded runs) needs two things switched on per connection: foreign keys (off by
default, so `ON DELETE CASCADE` and FK checks would silently not happen) and WAL (so the
report, a dashboard or the control plane can read while the runner writes). Postgres URLs
are pinned to the psycopg 3 driver, whatever spelling the operator used.
Nothing here runs at import; callers build the engine they need.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

from cascade.store.models import Base

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another writer's lock before failing."""


def normalize_url(url: str | URL) -> URL:
    """`postgres://` and `postgresql://` become `postgresql+psycopg://`; others pass through."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # In-memory databases answer "memory" and keep their journal; that is fine.
        cursor.execute("PRAGMA journal_mode=WAL")
        # Safe under WAL (a crash may lose the last commits, never corrupt the file), and it
        # keeps a commit per training step cheap.
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def make_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for `url` (extra keyword arguments go to `create_engine`).

    For a SQLite file, its parent directory is created, so `sqlite:///runs/<name>/cascade.db`
    works on a fresh checkout.
    """
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    if backend == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


def create_all(engine: Engine) -> None:
    """Create missing tables (embedded runs and tests; Postgres deployments use Alembic)."""
    Base.metadata.create_all(engine)


def prepare_schema(engine: Engine) -> None:
    """Make the schema current: `create_all` for a SQLite file (a run's own database, made and
    read by one version of the code), Alembic `upgrade head` for anything shared (Postgres), so
    a runner and the control plane can meet on one database in either order.
    """
    if engine.dialect.name == "sqlite":
        create_all(engine)
        return
    from cascade.store import migrate

    migrate.upgrade(engine)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any exception, always close.

    `expire_on_commit=False`, so rows returned from the block can still be read after it;
    re-query (the repository functions take ids) when you need fresh values.
    """
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()

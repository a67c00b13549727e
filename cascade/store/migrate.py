"""Schema migrations: bring a database to the models' schema with Alembic.

The control plane runs `wait_for_database` then `upgrade` before it serves (the FastAPI
template's prestart), and a runner pointed at Postgres (`cascade run --db postgresql://...`)
does the same, so whichever process comes first creates the schema and the other finds it
current. On Postgres the upgrade holds an advisory lock for its transaction, so two processes
starting together do not both try to create the tables. The migration scripts live in
`migrations/versions/`; no alembic.ini or URL is kept in the repository.
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
ADVISORY_LOCK_KEY = 0x6361736361  # "casca": any constant the other writers of this database share


class DatabaseUnavailable(RuntimeError):
    """The database did not answer within the wait."""


def _config(connection: Connection | None = None):  # -> alembic.config.Config (imported lazily)
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "no migration scripts found"
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _run(engine: Engine, command_name: str, revision: str) -> None:
    from alembic import command

    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        getattr(command, command_name)(_config(conn), revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply every migration up to `revision` in one transaction (Postgres DDL is transactional)."""
    _run(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    _run(engine, "downgrade", revision)


def wait_for_database(engine: Engine, timeout_s: float = 30.0, interval_s: float = 0.5) -> None:
    """Return once `SELECT 1` succeeds; raise `DatabaseUnavailable` naming the last error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return
        except OperationalError as err:
            if time.monotonic() >= deadline:
                first = str(err.orig).strip().splitlines()[0] if err.orig else str(err)
                raise DatabaseUnavailable(
                    f"database at {engine.url.render_as_string(hide_password=True)} did not answer "
                    f"within {timeout_s:g}s: {first}"
                ) from None
            time.sleep(interval_s)

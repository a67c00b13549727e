"""Which database errors are an outage (retry the transaction) and which are a bug (raise).

A Postgres restart or failover shows up as a dropped connection in use (SQLAlchemy marks it
`connection_invalidated`), a refused or reset connect (psycopg gives no SQLSTATE), or the
server's own "shutting down / starting up" codes. A SQLite writer can find the file locked past
its busy timeout. Anything else of the same exception types (a missing table, a constraint, a
syntax error) is not helped by waiting and is raised at once.

The pool drops dead connections by itself: Postgres engines are made with `pool_pre_ping`
(`cascade.store.db.make_engine`), and a connection that failed in use is invalidated by
SQLAlchemy, so the retried transaction gets a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from cascade.resilience import Dependency

TRANSIENT_TYPES: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)

SERVER_GOING_AWAY = {"57P01", "57P02", "57P03", "53300"}
"""admin_shutdown, crash_shutdown, cannot_connect_now (starting up / shutting down),
too_many_connections (a failover's reconnect storm)."""


def is_transient(err: BaseException) -> bool:
    if not isinstance(err, DBAPIError):
        return False
    if isinstance(err, InterfaceError) or err.connection_invalidated:
        return True
    orig = err.orig
    module = type(orig).__module__
    if module.startswith("psycopg"):
        sqlstate = getattr(orig, "sqlstate", None)
        # no SQLSTATE: the client failed to reach the server (refused, reset, closed)
        return sqlstate is None or sqlstate.startswith("08") or sqlstate in SERVER_GOING_AWAY
    if module == "sqlite3":
        text = str(orig).lower()
        return "locked" in text or "busy" in text
    return False


def database_dependency(give_up_after_s: float, log: Callable[[str], None]) -> Dependency:
    """The store as a `Dependency`: every runner transaction goes through its `call`."""
    return Dependency(
        "database", give_up_after_s=give_up_after_s, transient=TRANSIENT_TYPES, retry_if=is_transient, log=log
    )

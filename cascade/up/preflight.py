"""What `cascade up` checks before it starts any process: that the run directory may be used
with the flags given, and that no live runner holds the cascade it would run.

The cascade is the one named by `--db --cascade-id`, else the one the run directory's `run.json`
recorded. A lease whose holder is alive (not expired, and on this host a pid that exists) refuses
the start, naming the holder; a database that cannot be read is left to the learner, which
reports it itself.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from cascade.runner.fresh import has_history
from cascade.runner.record import read_record
from cascade.store import db, leases


def holder_of(db_url: str, cascade_id: int) -> str | None:
    """Who holds `cascade_id`'s lease and is alive (the `LeaseHeld` message), or None."""
    try:
        parsed = make_url(db_url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() == "sqlite" and not (parsed.database and Path(parsed.database).is_file()):
        return None  # no database yet: nobody holds anything (and none is created here)
    engine = db.make_engine(db_url)
    try:
        with db.session_scope(engine) as s:
            lease = leases.lease_of(s, cascade_id)
            now = leases.db_now(s)
            if lease is None or leases.holder_is_dead(lease, now):
                return None
            return str(leases.LeaseHeld(lease, now))
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()


def refusal(
    run_dir: Path, *, db_url: str | None, cascade_id: int | None, resume: bool, fresh: bool
) -> str | None:
    """Why `cascade up` must not start (one line), or None."""
    if has_history(run_dir) and not (resume or fresh):
        return f"{run_dir} already holds a run: pass --resume to continue it or --fresh to start over"
    target: tuple[str, int] | None = None
    if db_url is not None and cascade_id is not None:
        target = (db_url, cascade_id)
    else:
        try:
            record = read_record(run_dir)
        except (OSError, ValueError, TypeError):
            record = None
        if record is not None:
            url = db_url or (record.db_url if record.db_url_complete else None)
            target = None if url is None else (url, record.cascade_id)
    if target is None:
        return None
    return holder_of(*target)

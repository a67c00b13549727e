"""`--fresh`: start over in a run directory that holds a run, deleting nothing.

It asks first in a terminal, and elsewhere (CI, a pod, `cascade up`'s child processes) needs
`--yes`. Then every check comes before any change on disk: the directory must be a run's (not
some directory given by mistake), no live runner may hold the old run's cascade (its lease, in
the database run.json names), and the cascade to run must be runnable (`RunStore.check_joinable`,
called by the runner). Only then is the old directory renamed to `<run>.old-<UTC time>`, next
to it: its checkpoints and teachers stay there until the operator deletes them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from cascade.runner.record import RECORD_FILE, public_db_url, read_record
from cascade.runner.run_state import RunDirError
from cascade.store import db, leases
from cascade.store.models import RunLease

OWN_DB = "cascade.db"
RUN_MARKERS = (RECORD_FILE, OWN_DB, "checkpoints", "teachers")
"""What only a run directory holds: without any of them, `--fresh` refuses to move it."""


def has_history(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(run_dir.iterdir())


def confirm_fresh(
    run_dir: Path, *, yes: bool, ask: Callable[[str], str] = input, interactive: bool | None = None
) -> str | None:
    """None when `--fresh` may go ahead; else why not (one line)."""
    if yes or not has_history(run_dir):
        return None
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        return f"--fresh would move the run in {run_dir} aside: add --yes to confirm (no terminal to ask)"
    answer = ask(
        f"--fresh moves the run in {run_dir} (checkpoints, teachers, history) aside and starts over. "
        "Type 'yes': "
    )
    if answer.strip().lower() != "yes":
        return "not confirmed: nothing moved"
    return None


def check_not_nested(run_dir: Path) -> None:
    """A run directory inside another run's (resolved: `..` and symlinks followed) would write into
    that run: its run.json, samples log and checkpoints."""
    for parent in run_dir.resolve().parents:
        if (parent / RECORD_FILE).is_file():
            raise RunDirError(
                f"{run_dir} resolves to {run_dir.resolve()}, inside the run directory {parent}: "
                "give a run directory of its own"
            )


def check_is_run_dir(run_dir: Path) -> None:
    """A directory with content but none of a run's files is not moved (a mistyped --run-dir)."""
    if not has_history(run_dir):
        return
    if not any((run_dir / name).exists() for name in RUN_MARKERS):
        raise RunDirError(
            f"--fresh: {run_dir} does not look like a run directory (none of {', '.join(RUN_MARKERS)}): "
            "nothing moved; give the run's own --run-dir"
        )


def _old_run_database(run_dir: Path, given_db: str | None) -> tuple[str, int | None] | None:
    """The database that holds the old run's lease and its cascade id (None: any cascade in it),
    or None when the old run has no database to ask (it never started)."""
    record = read_record(run_dir)
    own = run_dir / OWN_DB
    if record is None or make_url(record.db_url).get_backend_name() == "sqlite":
        if own.is_file():
            return f"sqlite:///{own.resolve()}", None
        if record is None:
            return None
        recorded = make_url(record.db_url).database
        if recorded and Path(recorded).is_file():
            return record.db_url, record.cascade_id
        return None
    if record.db_url_complete:
        return record.db_url, record.cascade_id
    if given_db is not None and public_db_url(given_db) == record.db_url:
        return given_db, record.cascade_id
    raise RunDirError(
        f"--fresh: the run in {run_dir} ran on {record.db_url}: give --db with its password so its "
        "lease can be checked first (nothing moved)"
    )


def check_not_held(run_dir: Path, given_db: str | None) -> None:
    """`LeaseHeld` when a live runner holds the old run's cascade; `RunDirError` when that cannot
    be checked (its database does not answer)."""
    found = _old_run_database(run_dir, given_db)
    if found is None:
        return
    url, cascade_id = found
    engine = db.make_engine(url)
    try:
        with db.session_scope(engine) as s:
            now = leases.db_now(s)
            if cascade_id is not None:
                rows = [r for r in [leases.lease_of(s, cascade_id)] if r is not None]
            else:
                rows = list(s.query(RunLease))
            for row in rows:
                if not leases.holder_is_dead(row, now):
                    raise leases.LeaseHeld(row, now)
    except SQLAlchemyError as err:
        cause = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise RunDirError(
            f"--fresh: cannot check whether a runner holds the run in {run_dir} "
            f"({public_db_url(url)}: {cause}): nothing moved"
        ) from None
    finally:
        engine.dispose()


def aside_path(run_dir: Path, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    path = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    n = 1
    while path.exists():
        path = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
        n += 1
    return path


def move_aside(run_dir: Path, log: Callable[[str], None]) -> Path | None:
    """Rename a run directory that holds anything to `<run>.old-<UTC time>` (None: nothing to
    move). Call it only after every check passed."""
    if not has_history(run_dir):
        return None
    target = aside_path(run_dir)
    run_dir.rename(target)
    log(f"--fresh: the previous run in {run_dir} was moved to {target} (delete it when no longer needed)")
    return target

"""Runner leases: at most one live runner per cascade, and a way to tell a dead one.

A runner takes the cascade's lease row when it starts or resumes (in the same transaction as
its run row), renews it every `heartbeat_s` and releases it when it stops. The row's primary key
is the cascade, and taking it locks the row: two runners racing get one lease and one refusal
naming the holder. A lease whose `expires_at` passed belongs to nobody: its run shows as
`stalled` and `--resume` takes the lease over. A runner on the same host whose pid is gone is
also dead (a kill -9 need not wait for the expiry).

Times are the writers' clocks in UTC: hosts sharing a database are assumed NTP-synchronised
(an expiry of tens of seconds tolerates the usual skew).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from cascade.store.models import RunLease, utcnow


class LeaseHeld(Exception):
    """Another live runner holds the cascade's lease."""

    def __init__(self, lease: RunLease, now: datetime) -> None:
        self.host, self.pid = lease.host, lease.pid
        self.since, self.heartbeat_at, self.expires_at = (
            lease.acquired_at,
            lease.heartbeat_at,
            lease.expires_at,
        )
        left = max(0.0, (lease.expires_at - now).total_seconds())
        super().__init__(
            f"cascade {lease.cascade_id} is being run by {lease.host} pid {lease.pid} "
            f"(run {lease.run_id}, since {lease.acquired_at:%Y-%m-%d %H:%M:%S} UTC, last heartbeat "
            f"{lease.heartbeat_at:%H:%M:%S} UTC; its lease expires in {left:.0f}s unless renewed)"
        )


@dataclass(frozen=True)
class Holder:
    token: str
    host: str
    pid: int

    @classmethod
    def this_process(cls, token: str) -> Holder:
        return cls(token=token, host=this_host(), pid=os.getpid())


def this_host() -> str:
    """Where a pid means one process: the hostname and the PID namespace. Containers with host
    networking share the host's name but each has its own PID namespace (where the learner is
    often pid 1): by the hostname alone, one container would read another's live runner as dead
    because no such pid exists in its own namespace, and take over a lease still in use."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # e.g. pid:[4026531836]
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()} {namespace}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_live(lease: RunLease | None, now: datetime | None = None) -> bool:
    return lease is not None and lease.expires_at > (now or utcnow())


def holder_is_dead(lease: RunLease, now: datetime) -> bool:
    """Expired, or held by a process of this host (and PID namespace) that no longer exists."""
    if not is_live(lease, now):
        return True
    return lease.host == this_host() and not _pid_alive(lease.pid)


def acquire(
    session: Session, *, cascade_id: int, run_id: int | None, holder: Holder, expiry_s: float
) -> RunLease:
    """Take (or renew) the cascade's lease for `holder`; `LeaseHeld` if a live runner has it."""
    now = utcnow()
    expires = now + timedelta(seconds=expiry_s)
    row = session.scalars(
        select(RunLease)
        .where(RunLease.cascade_id == cascade_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()
    if row is None:
        row = RunLease(
            cascade_id=cascade_id, acquired_at=now, token=holder.token, host=holder.host, pid=holder.pid
        )
        session.add(row)
    elif row.token != holder.token:
        if not holder_is_dead(row, now):
            raise LeaseHeld(row, now)
        row.token, row.host, row.pid, row.acquired_at = holder.token, holder.host, holder.pid, now
    row.run_id = run_id if run_id is not None else row.run_id
    row.heartbeat_at, row.expires_at = now, expires
    session.flush()  # a concurrent insert of the same cascade fails here (primary key)
    return row


def renew(session: Session, *, cascade_id: int, token: str, expiry_s: float) -> bool:
    """Extend the lease if `token` still holds it; False when another runner took it over."""
    now = utcnow()
    result = session.execute(
        update(RunLease)
        .where(RunLease.cascade_id == cascade_id, RunLease.token == token)
        .values(heartbeat_at=now, expires_at=now + timedelta(seconds=expiry_s))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def release(session: Session, *, cascade_id: int, token: str) -> None:
    session.execute(delete(RunLease).where(RunLease.cascade_id == cascade_id, RunLease.token == token))


def lease_of(session: Session, cascade_id: int) -> RunLease | None:
    return session.get(RunLease, cascade_id, populate_existing=True)

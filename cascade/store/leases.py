"""Runner leases: at most one runner writes a cascade's state, and a way to tell a dead one.

A runner takes the cascade's lease row when it starts or resumes (in the same transaction as
its run row), renews it every `heartbeat_s` and releases it when it stops. The row's primary key
is the cascade, and taking it locks the row: two runners racing get one lease and one refusal
naming the holder. A lease whose `expires_at` passed belongs to nobody: its run shows as
`stalled` and `--resume` takes the lease over. A runner on the same host (and PID namespace)
whose pid is gone is also dead (a kill -9 need not wait for the expiry); one whose pid is alive
and running is never declared dead, whatever the clocks say.

**Fencing.** Every takeover moves the cascade's lease *epoch* on (`cascades.lease_epoch`, never
reset, so a released and re-taken lease gets a new one too). Every write of a runner checks its
token and epoch against the lease row in the same transaction as the write (`fence`): once
another runner has taken over, a stale runner's write (one that was frozen, or partitioned
from the database, past its expiry) is refused with `LeaseLost` and only the stale runner
stops. The check updates the row, so it holds the row's lock until the write commits: a
takeover waits for a write in flight and a write waits for a takeover in flight, never both.
A lease that expired but that nobody took over is renewed by the fenced write itself (nothing
else could have written meanwhile).

**Clocks.** Every lease time is the database's clock (`db_now`), read in the transaction that
decides: a writer's clock that is off by a minute neither makes a healthy run look dead nor
lets a taker take over early. `clock_skew_s` says how far this host's clock is from it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from cascade.store.models import Cascade, RunLease, UTCDateTime, utcnow

SKEW_WARN_S = 5.0
"""A writer whose clock is further than this from the database's is warned about."""


class LeaseHeld(Exception):
    """Another live runner holds the cascade's lease."""

    def __init__(self, lease: RunLease, now: datetime) -> None:
        self.host, self.pid = lease.host, lease.pid
        self.since, self.heartbeat_at, self.expires_at = (
            lease.acquired_at,
            lease.heartbeat_at,
            lease.expires_at,
        )
        left = (lease.expires_at - now).total_seconds()
        expiry = (
            f"its lease expires in {left:.0f}s unless renewed"
            if left > 0
            else f"its lease expired {-left:.0f}s ago, but pid {lease.pid} is alive on this host: "
            "stop it, or wait for it to exit"
        )
        super().__init__(
            f"cascade {lease.cascade_id} is being run by {lease.host} pid {lease.pid} "
            f"(run {lease.run_id}, epoch {lease.epoch}, since {lease.acquired_at:%Y-%m-%d %H:%M:%S} UTC, "
            f"last heartbeat {lease.heartbeat_at:%H:%M:%S} UTC; {expiry})"
        )


class LeaseLost(Exception):
    """This runner's lease was taken over: its write was refused and it must stop writing."""

    def __init__(self, cascade_id: int, epoch: int, holder: RunLease | None) -> None:
        self.cascade_id, self.epoch = cascade_id, epoch
        now_held = (
            f"now held by {holder.host} pid {holder.pid} (epoch {holder.epoch})"
            if holder is not None
            else "released"
        )
        super().__init__(
            f"lease lost: cascade {cascade_id}'s lease (epoch {epoch}) was taken over, {now_held}; "
            "this runner's write was refused and it stops"
        )


@dataclass(frozen=True)
class Holder:
    token: str
    host: str
    pid: int
    pid_start: int | None = None
    """When the process started (clock ticks since boot): a pid reused by another process is
    not taken for the holder."""

    @classmethod
    def this_process(cls, token: str) -> Holder:
        return cls(token=token, host=this_host(), pid=os.getpid(), pid_start=process_start(os.getpid()))


@dataclass(frozen=True)
class Fence:
    """What a runner's writes are checked against: its token and the epoch it took."""

    cascade_id: int
    token: str
    epoch: int


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


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (field 3 on), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (None without procfs)."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _pid_running(pid: int, started: int | None) -> bool:
    """The holder's process exists (the same one: started when it did), and is neither a zombie
    nor stopped (SIGSTOP, a debugger): a stopped process renews nothing, and fencing makes
    taking its lease over safe."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _proc_stat(pid)
    if fields is None:
        return True  # no procfs: existing is all we can tell
    if started is not None and len(fields) > 19 and int(fields[19]) != started:
        return False  # the pid was reused
    return fields[0] not in ("Z", "X", "T", "t")


def db_now(session: Session) -> datetime:
    """The database's clock (UTC, aware). SQLite is a file this process opens: its clock is ours."""
    if session.get_bind().dialect.name == "sqlite":
        return utcnow()
    value = session.scalar(select(func.clock_timestamp().cast(UTCDateTime)))
    assert value is not None
    return value


def clock_skew_s(session: Session) -> float:
    """This host's clock minus the database's, in seconds (positive: this host is ahead)."""
    return (utcnow() - db_now(session)).total_seconds()


def is_live(lease: RunLease | None, now: datetime) -> bool:
    """Not expired at `now`, the database's clock (`db_now`)."""
    return lease is not None and lease.expires_at > now


def holder_is_dead(lease: RunLease, now: datetime) -> bool:
    """A holder in this host's PID namespace is dead exactly when its process is gone or
    stopped, whatever its lease says (a live one's heartbeat may be failing against a database
    it cannot reach: it is no corpse). A holder elsewhere is dead once its lease expired by the
    database's clock (`now`)."""
    if lease.host == this_host():
        return not _pid_running(lease.pid, lease.pid_start)
    return not is_live(lease, now)


def _next_epoch(session: Session, cascade_id: int) -> int:
    session.execute(
        update(Cascade).where(Cascade.id == cascade_id).values(lease_epoch=Cascade.lease_epoch + 1)
    )
    epoch = session.scalar(select(Cascade.lease_epoch).where(Cascade.id == cascade_id))
    assert epoch is not None
    return int(epoch)


def acquire(
    session: Session, *, cascade_id: int, run_id: int | None, holder: Holder, expiry_s: float
) -> RunLease:
    """Take (or renew) the cascade's lease for `holder`; `LeaseHeld` if a live runner has it.
    Taking it from another holder (or anew) moves the epoch on."""
    row = session.scalars(
        select(RunLease)
        .where(RunLease.cascade_id == cascade_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()
    now = db_now(session)  # read after the row lock: the time the decision is made
    if row is None:
        row = RunLease(
            cascade_id=cascade_id,
            acquired_at=now,
            token=holder.token,
            host=holder.host,
            pid=holder.pid,
            pid_start=holder.pid_start,
            epoch=_next_epoch(session, cascade_id),
        )
        session.add(row)
    elif row.token != holder.token:
        if not holder_is_dead(row, now):
            raise LeaseHeld(row, now)
        row.token, row.host, row.pid, row.acquired_at = holder.token, holder.host, holder.pid, now
        row.pid_start = holder.pid_start
        row.epoch = _next_epoch(session, cascade_id)
    row.run_id = run_id if run_id is not None else row.run_id
    row.heartbeat_at, row.expires_at = now, now + timedelta(seconds=expiry_s)
    session.flush()  # a concurrent insert of the same cascade fails here (primary key)
    return row


def fence(session: Session, fence: Fence, *, expiry_s: float) -> None:
    """Refuse this transaction's writes (`LeaseLost`) unless `fence` still holds the lease; if it
    does, the lease is renewed and its row stays locked until the transaction ends."""
    now = db_now(session)
    result = session.execute(
        update(RunLease)
        .where(
            RunLease.cascade_id == fence.cascade_id,
            RunLease.token == fence.token,
            RunLease.epoch == fence.epoch,
        )
        .values(heartbeat_at=now, expires_at=now + timedelta(seconds=expiry_s))
        .execution_options(synchronize_session=False)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        raise LeaseLost(fence.cascade_id, fence.epoch, lease_of(session, fence.cascade_id))


def renew(session: Session, *, cascade_id: int, token: str, expiry_s: float) -> bool:
    """Extend the lease if `token` still holds it; False when another runner took it over."""
    now = db_now(session)
    result = session.execute(
        update(RunLease)
        .where(RunLease.cascade_id == cascade_id, RunLease.token == token)
        .values(heartbeat_at=now, expires_at=now + timedelta(seconds=expiry_s))
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def release(session: Session, *, cascade_id: int, token: str) -> None:
    session.execute(delete(RunLease).where(RunLease.cascade_id == cascade_id, RunLease.token == token))


def lease_of(session: Session, cascade_id: int) -> RunLease | None:
    return session.get(RunLease, cascade_id, populate_existing=True)

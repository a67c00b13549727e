"""What the API can tell about a run's dependencies, from what the runner could write.

The runner logs each outage it rode out as an `outage` event (with its next step row) and, while
the database is up, a `degraded` event when a Redis, teacher or rollout outage begins (with its
heartbeat). While the *database* is down it can write nothing: what shows then (to an API that
can still read it, e.g. the runner alone lost its connection) is the heartbeat going stale.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from cascade.store.models import Event, RunLease
from services.api import schemas

STALE_HEARTBEATS = 2
"""A live runner's heartbeat older than this many `lease.heartbeat_s` shows as degraded."""


def run_health(
    run_id: int,
    events: Iterable[Event],
    lease: RunLease | None,
    *,
    heartbeat_s: float,
    now: datetime,
) -> tuple[dict[str, str], dict[str, schemas.DependencyOutages]]:
    """(degraded: dependency -> what is known now, outages: dependency -> the ones ridden out).

    `events`: the cascade's `outage` and `degraded` events in id order; `lease`: this run's lease
    if it is live (a run nobody runs is not degraded, it is stalled or finished)."""
    outages: dict[str, schemas.DependencyOutages] = {}
    open_since: dict[str, tuple[datetime, str | None]] = {}
    for event in events:
        detail = event.detail or {}
        if detail.get("run_id") != run_id or not isinstance(detail.get("dependency"), str):
            continue
        name = detail["dependency"]
        if event.kind == "degraded":
            open_since[name] = (event.at, detail.get("cause"))
        elif event.kind == "outage":
            open_since.pop(name, None)
            seen = outages.setdefault(name, schemas.DependencyOutages())
            seen.outages += int(detail.get("outages", 1))
            seen.down_s = round(seen.down_s + float(detail.get("down_s", 0.0)), 3)
            seen.last_cause, seen.last_at = detail.get("cause"), event.at
    degraded: dict[str, str] = {}
    if lease is None:
        return degraded, outages
    for name, (since, cause) in open_since.items():
        degraded[name] = f"unreachable since {since:%H:%M:%S} UTC ({cause}); the run waits, retrying"
    age = (now - lease.heartbeat_at).total_seconds()
    if age > STALE_HEARTBEATS * heartbeat_s:
        degraded["heartbeat"] = (
            f"no heartbeat for {age:.0f}s (one every {heartbeat_s:g}s expected): the runner cannot "
            "reach the database, or is blocked"
        )
    return degraded, outages

"""The API shows a run's outages: open ones as `degraded` while a live runner rides them out, the
ridden-out ones as counters, and a silent runner (it cannot reach the database) by its stale
heartbeat. A real runner store (SQLite) writes what `services.api.queries` reads back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from cascade.config import CascadeConfig
from cascade.resilience import Dependency
from cascade.runner.run_store import RunStore
from cascade.store import db
from cascade.store.leases import Holder
from cascade.store.models import RunLease, utcnow
from services.api import queries, schemas

CONFIG = {
    "name": "health",
    "model": {"path": "models/tiny"},
    "domains": [{"name": "math"}],
    "stages": [{"domain": "math", "advance": {"max_steps": 3}}],
    "lease": {"heartbeat_s": 1, "expiry_s": 60},
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    s = RunStore(f"sqlite:///{tmp_path / 'c.db'}", give_up_after_s=60, log=lambda _: None)
    s.holder = Holder.this_process(uuid.uuid4().hex)  # type: ignore[attr-defined]
    s.begin(CascadeConfig.model_validate(CONFIG), run_dir=tmp_path, distill=False, holder=s.holder)  # type: ignore[attr-defined]
    s.stage_started(0)
    yield s
    s.engine.dispose()


def run_as_api_shows(store: RunStore) -> schemas.RunOut:
    assert store.cascade_id is not None
    with db.session_scope(store.engine) as s:
        return queries.cascade_detail(s, store.cascade_id).runs[0]


def test_an_outage_shows_degraded_while_open_then_counted(store: RunStore) -> None:
    token = store.holder.token  # type: ignore[attr-defined]
    redis = Dependency("redis", give_up_after_s=60, transient=(ConnectionError,), log=lambda _: None)
    store.watched.append(redis)
    assert run_as_api_shows(store).degraded == {} and run_as_api_shows(store).outages == {}

    redis.failed(ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused."))
    assert store.renew_lease(token, 60)
    store.renew_lease(token, 60)  # still down: shown once
    shown = run_as_api_shows(store)
    assert list(shown.degraded) == ["redis"]
    assert "unreachable since" in shown.degraded["redis"] and "Connection refused" in shown.degraded["redis"]
    assert shown.heartbeat_age_s is not None and shown.heartbeat_age_s < 5

    redis.succeeded()
    store.record_step(0, 1, 1, {"loss": 1.0})
    shown = run_as_api_shows(store)
    assert shown.degraded == {}
    assert shown.outages["redis"].outages == 1 and shown.outages["redis"].down_s >= 0
    assert "Connection refused" in (shown.outages["redis"].last_cause or "")


def test_a_silent_runner_shows_its_stale_heartbeat(store: RunStore) -> None:
    with db.session_scope(store.engine) as s:
        s.execute(update(RunLease).values(heartbeat_at=utcnow() - timedelta(seconds=7)))
    shown = run_as_api_shows(store)
    assert shown.status == "running" and shown.heartbeat_age_s is not None and shown.heartbeat_age_s >= 7
    assert "no heartbeat for 7s (one every 1s expected)" in shown.degraded["heartbeat"]

"""One writer by construction: every write of a runner is fenced with its lease's epoch, in the
same transaction, and every lease decision uses the database's clock (issue 34).

The faults: a runner frozen or cut off past its lease is taken over and then wakes up with a
write in hand (the new holder must never meet it: before, the *new* runner died on
`ConflictingRow` and the samples log held the step twice); a writer whose clock is a minute
behind looked dead to everyone; a taker a minute ahead took a live lease at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from cascade.config import CascadeConfig
from cascade.runner.run_store import LeaseHeld, LeaseLost, RunStore
from cascade.runner.staging import clear_stale, publish, staged_path
from cascade.store import db, leases
from cascade.store.leases import Holder
from cascade.store.models import Cascade, RunLease, Step, utcnow


def config(out: Path) -> CascadeConfig:
    return CascadeConfig.model_validate(
        {
            "name": "fenced",
            "model": {"path": str(out / "model")},
            "domains": [
                {"name": "math", "prompts": {"kind": "synthetic", "seed": 0, "n_train": 8, "n_eval": 4}}
            ],
            "stages": [{"domain": "math", "advance": {"max_steps": 4}}],
            "lease": {"heartbeat_s": 1, "expiry_s": 30},
            "output_dir": str(out),
        }
    )


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


def holder() -> Holder:
    return Holder.this_process(uuid.uuid4().hex)


def left_for_dead(store: RunStore) -> None:
    """What a takeover sees of a runner frozen or partitioned on another host: a lease that
    stopped being renewed and expired (by the database's clock)."""
    with db.session_scope(store.engine) as s:
        lease = s.scalars(select(RunLease)).one()
        lease.expires_at = leases.db_now(s) - timedelta(seconds=1)
        lease.host = "another-host"


def step_rows(store: RunStore) -> list[tuple[int, float]]:
    with db.session_scope(store.engine) as s:
        return [
            (r.global_step, r.metrics["reward_mean"])
            for r in s.scalars(select(Step).order_by(Step.global_step))
        ]


def test_a_taken_over_runner_writes_nothing_and_the_new_holder_everything(url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    stale, fresh = RunStore(url, log=lambda _: None), RunStore(url, log=lambda _: None)
    ids = stale.begin(cfg, run_dir=tmp_path / "run", distill=False, holder=holder())
    assert stale.fence is not None and stale.fence.epoch == 1
    stale.stage_started(0)
    stale.record_step(0, 1, 1, {"reward_mean": 0.1})

    left_for_dead(stale)
    fresh.resume(ids, holder=holder(), expiry_s=30)
    assert fresh.fence is not None and fresh.fence.epoch == 2

    ran: list[str] = []
    staged = staged_path(tmp_path / "ckpt" / "step-000002", stale.fence.epoch)
    staged.mkdir(parents=True)
    writes = {
        "record_step": lambda: stale.record_step(
            0, 2, 2, {"reward_mean": 0.9}, then=lambda: ran.append("samples")
        ),
        "record_checkpoint": lambda: stale.record_checkpoint(
            0, 2, 2, tmp_path / "ckpt" / "step-000002", publish=lambda: ran.append("publish")
        ),
        "stage_started": lambda: stale.stage_started(0),
        "stage_completed": lambda: stale.stage_completed(0, stopped_by="max_steps", steps=2),
        "truncate_after": lambda: stale.truncate_after(0),
        "finish": lambda: stale.finish("completed"),
    }
    for name, write in writes.items():
        with pytest.raises(LeaseLost, match="epoch 1.*taken over"):
            write()
        assert ran == [], name
    assert step_rows(fresh) == [(1, 0.1)]  # nothing of the stale runner landed

    fresh.record_step(0, 2, 2, {"reward_mean": 0.5})  # the rightful runner redoes the step: no conflict
    fresh.record_checkpoint(0, 2, 2, tmp_path / "ckpt" / "step-000002")
    assert step_rows(fresh) == [(1, 0.1), (2, 0.5)]
    assert [p.name for p in clear_stale(tmp_path / "ckpt")] == [staged.name]
    with db.session_scope(fresh.engine) as s:
        assert s.get(Cascade, ids["cascade_id"]).lease_epoch == 2  # type: ignore[union-attr]


def test_the_epoch_never_goes_back_after_a_release(url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = RunStore(url, log=lambda _: None)
    ids = first.begin(cfg, run_dir=tmp_path / "run", distill=False, holder=(h := holder()))
    first.release_lease(h.token)  # a clean stop deletes the lease row
    second = RunStore(url, log=lambda _: None)
    second.resume(ids, holder=holder(), expiry_s=30)
    assert second.fence is not None and second.fence.epoch == 2
    with pytest.raises(LeaseLost):
        first.record_step(0, 1, 1, {"reward_mean": 0.0})


def test_an_expired_lease_nobody_took_is_renewed_by_the_write(url: str, tmp_path: Path) -> None:
    """A database outage longer than the lease: nothing else wrote, so the runner goes on."""
    store = RunStore(url, log=lambda _: None)
    store.begin(config(tmp_path), run_dir=tmp_path / "run", distill=False, holder=holder())
    left_for_dead(store)
    store.record_step(0, 1, 1, {"reward_mean": 0.0})
    with db.session_scope(store.engine) as s:
        lease = s.scalars(select(RunLease)).one()
        assert leases.is_live(lease, leases.db_now(s))


def test_a_write_in_flight_holds_off_a_takeover(postgres_url: str, tmp_path: Path) -> None:
    """The fence locks the lease row until the write commits: a taker arriving meanwhile waits,
    then finds the lease renewed by that write, and is refused."""
    cfg = config(tmp_path)
    writer, taker = RunStore(postgres_url, log=lambda _: None), RunStore(postgres_url, log=lambda _: None)
    ids = writer.begin(cfg, run_dir=tmp_path / "run", distill=False, holder=holder())
    left_for_dead(writer)
    inside, outcome = threading.Event(), []

    def slow_samples_line() -> None:
        inside.set()
        time.sleep(1.5)

    thread = threading.Thread(
        target=lambda: writer.record_step(0, 1, 1, {"reward_mean": 0.2}, then=slow_samples_line)
    )
    thread.start()
    assert inside.wait(30)
    t0 = time.monotonic()
    try:
        taker.resume(ids, holder=holder(), expiry_s=30)
        outcome.append("took over")
    except LeaseHeld:
        outcome.append("refused")
    waited = time.monotonic() - t0
    thread.join()
    assert outcome == ["refused"] and waited > 0.5
    assert step_rows(writer) == [(1, 0.2)]


def test_lease_times_are_the_database_clock(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer 60 s behind stays live; a taker 60 s ahead finds it live; both are told."""
    cfg = config(tmp_path)
    said: list[str] = []
    monkeypatch.setattr(leases, "utcnow", lambda: utcnow() - timedelta(seconds=60))
    writer = RunStore(postgres_url, log=said.append)
    ids = writer.begin(cfg, run_dir=tmp_path / "run", distill=False, holder=holder())
    assert writer.renew_lease(writer.fence.token, 30)  # type: ignore[union-attr]
    with db.session_scope(writer.engine) as s:
        lease = s.scalars(select(RunLease)).one()
        now = leases.db_now(s)
        assert leases.is_live(lease, now) and lease.expires_at > now + timedelta(seconds=25)
        lease.host = "another-host"  # so only the clock can decide
    assert any("60." in line and "behind" in line for line in said), said

    monkeypatch.setattr(leases, "utcnow", lambda: utcnow() + timedelta(seconds=60))
    taker = RunStore(postgres_url, log=said.append)
    with pytest.raises(LeaseHeld, match="expires in"):
        taker.resume(ids, holder=holder(), expiry_s=30)
    assert any("ahead of" in line for line in said), said


def test_publish_is_idempotent_and_staging_is_never_a_checkpoint(tmp_path: Path) -> None:
    final = tmp_path / "step-000003"
    staged = staged_path(final, 7)
    assert staged.name == "step-000003.e7.staged"
    staged.mkdir()
    (staged / "model.safetensors").write_bytes(b"x")
    publish(staged, final)
    publish(staged, final)  # the transaction retried after a commit whose reply was lost
    assert (final / "model.safetensors").read_bytes() == b"x" and not staged.exists()
    with pytest.raises(FileNotFoundError, match="missing"):
        publish(staged_path(tmp_path / "step-000004", 7), tmp_path / "step-000004")

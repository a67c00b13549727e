"""The actions the API offers (what the dashboard's buttons are made of) and /api/whoami.

First against the store itself: for every stage state and pending request, each stage command
is run by `cascade.store.control` in a rolled-back savepoint, and `services.api.actions` must
offer exactly the commands that are accepted and change something; likewise the cascade's abort
over cascade statuses, stage mixes, a live / expired / absent runner lease and open runs. Then
through the real server: the `actions` of a cascade and its stages as its state moves, each
offered path accepted by the write token, and whoami for each kind of token.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from api_procs import READ_TOKEN, WRITE_TOKEN, ApiServer, fresh_schema, running_api, tiny_config
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from cascade.store import control, leases, repo
from cascade.store.db import make_engine, prepare_schema, session_scope
from cascade.store.lifecycle import IllegalTransition
from cascade.store.models import CASCADE_STATUSES, STAGE_STATES, Cascade, Run, RunLease, Stage, utcnow
from services.api import actions

pytestmark = pytest.mark.postgres


def _outcome(session: Session, run: Any) -> bool:
    """Whether `run()` is accepted and changes something; rolled back either way."""
    savepoint = session.begin_nested()
    try:
        return bool(run())
    except IllegalTransition:
        return False
    finally:
        savepoint.rollback()


def test_offered_stage_commands_are_what_control_accepts(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    prepare_schema(engine)
    try:
        with session_scope(engine) as s:
            cascade = repo.create_cascade(s, name="walk", config={"name": "walk"})
            (stage,) = repo.create_stages(s, cascade_id=cascade.id, stages=[("a", "math")])
            checked = 0
            for state, desired in itertools.product(STAGE_STATES, (None, *STAGE_STATES)):
                stage.state, stage.desired_state = state, desired
                s.flush()
                accepted = []
                for command in actions.LEADS_TO:

                    def attempt(command: str = command) -> bool:
                        return control.stage_command(s, stage_id=stage.id, command=command, actor="t").changed

                    if _outcome(s, attempt):
                        accepted.append(command)
                    checked += 1
                s.refresh(stage)
                assert (stage.state, stage.desired_state) == (state, desired)  # rolled back
                assert actions.offered_stage_commands(state, desired) == accepted, (state, desired)
            assert checked == 6 * 7 * 3
    finally:
        engine.dispose()


STAGE_MIXES = [
    (("completed", None), ("running", None)),
    (("completed", None), ("running", "paused")),
    (("completed", None), ("running", "aborted")),
    (("running", "aborted"), ("aborted", None)),
    (("paused", None), ("pending", None)),
    (("pending", None), ("pending", None)),
    (("completed", None), ("completed", None)),
    (("aborted", None), ("aborted", None)),
    (("completed", None), ("failed", None)),
]


LEASES = ("live", "expired", "none")


def test_abort_is_offered_when_control_would_change_something(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    prepare_schema(engine)
    try:
        with session_scope(engine) as s:
            cascade = repo.create_cascade(s, name="abort", config={"name": "abort"})
            stages = repo.create_stages(s, cascade_id=cascade.id, stages=[("a", "math"), ("b", "code")])
            run = repo.start_run(s, cascade_id=cascade.id, seed=0, distill=False, output_dir="runs/x")
            holder = leases.Holder(token=uuid.uuid4().hex, host="elsewhere", pid=1)
            leases.acquire(s, cascade_id=cascade.id, run_id=run.id, holder=holder, expiry_s=600)
            offered_seen = set()
            cases = [
                (status, mix, lease, run_status)
                for status, mix, lease in itertools.product(CASCADE_STATUSES, STAGE_MIXES, LEASES)
                for run_status in (("running", "aborted") if status == "aborted" else ("running",))
            ]  # an open run matters once the cascade is aborted (abort closes it then)
            for status, mix, lease, run_status in cases:
                savepoint = s.begin_nested()
                cascade.status, run.status = status, run_status
                for stage, (state, desired) in zip(stages, mix, strict=True):
                    stage.state, stage.desired_state = state, desired
                row = s.get(RunLease, cascade.id)
                assert row is not None
                if lease == "none":
                    s.delete(row)
                elif lease == "expired":
                    row.expires_at = utcnow() - timedelta(seconds=1)
                s.flush()
                live = leases.is_live(leases.lease_of(s, cascade.id), leases.db_now(s))
                runs = list(s.scalars(select(Run).where(Run.cascade_id == cascade.id)))
                offered = actions.abort_offered(
                    cascade, repo.list_stages(s, cascade_id=cascade.id), runs, live
                )
                accepted = _outcome(s, lambda: control.abort_cascade(s, cascade_id=cascade.id, actor="t")[1])
                savepoint.rollback()
                assert offered == accepted, (status, mix, lease, run_status)
                offered_seen.add(offered)
            assert offered_seen == {True, False}
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- through the server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Engine]]:
    with fresh_schema() as db_url, running_api(db_url, tmp_path_factory.mktemp("actions")) as server:
        engine = make_engine(db_url)
        try:
            yield server, engine
        finally:
            engine.dispose()


def _offered(api: ApiServer, cascade_id: int) -> tuple[list[list[tuple[str, str]]], list[str]]:
    status, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    assert status == 200
    per_stage = [[(a["command"], a["leads_to"]) for a in st["actions"]] for st in detail["stages"]]
    for st in detail["stages"]:
        assert [a["path"] for a in st["actions"]] == [
            f"/api/stages/{st['id']}/{a['command']}" for a in st["actions"]
        ]
    assert all(a["path"] == f"/api/cascades/{cascade_id}/abort" for a in detail["actions"])
    return per_stage, [a["command"] for a in detail["actions"]]


def _runner_moves(engine: Engine, stage_id: int, state: str) -> None:
    with session_scope(engine) as s:
        repo.transition_stage(s, stage_id=stage_id, to_state=state, actor="runner")


def test_actions_follow_the_state_and_their_paths_work(served: tuple[ApiServer, Engine]) -> None:
    api, engine = served
    status, body = api.call(
        "POST", "/api/cascades", token=WRITE_TOKEN, json_body=tiny_config(stages=("math", "code"))
    )
    assert status == 201
    cascade_id, first, second = body["id"], body["stages"][0]["id"], body["stages"][1]["id"]
    assert _offered(api, cascade_id) == ([[], []], ["abort"])  # pending: only the cascade's abort
    _runner_moves(engine, first, "running")
    holder = leases.Holder(token=uuid.uuid4().hex, host="gpu-node-1", pid=7)
    with session_scope(engine) as s:
        leases.acquire(s, cascade_id=cascade_id, run_id=None, holder=holder, expiry_s=600)
        s.get(Cascade, cascade_id).status = "running"  # type: ignore[union-attr]

    def follow(stage_id: int, command: str) -> dict[str, Any]:
        _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
        (stage,) = [st for st in detail["stages"] if st["id"] == stage_id]
        (action,) = [a for a in stage["actions"] if a["command"] == command]
        status, out = api.call("POST", action["path"], token=WRITE_TOKEN)
        assert status == 200 and out["changed"], out
        return out["stage"]

    running = [("pause", "paused"), ("advance", "completed")]
    assert _offered(api, cascade_id) == ([running, []], ["abort"])
    assert follow(first, "pause")["desired_state"] == "paused"
    # the pause is not applied yet: resume withdraws it; advance may still replace it
    assert _offered(api, cascade_id)[0][0] == [("resume", "running"), ("advance", "completed")]
    assert follow(first, "resume")["desired_state"] is None
    follow(first, "pause")
    _runner_moves(engine, first, "paused")
    assert _offered(api, cascade_id)[0] == [[("resume", "running")], []]
    follow(first, "resume")
    _runner_moves(engine, first, "running")
    assert follow(first, "advance")["desired_state"] == "completed"
    assert _offered(api, cascade_id)[0][0] == [("pause", "paused")]
    _runner_moves(engine, first, "completed")
    assert _offered(api, cascade_id) == ([[], []], ["abort"])
    _runner_moves(engine, second, "running")
    status, out = api.call("POST", f"/api/cascades/{cascade_id}/abort", token=WRITE_TOKEN)
    assert status == 200 and out["changed"]
    # the live runner is asked to abort: nothing is left to offer (an abort cannot be replaced)
    assert _offered(api, cascade_id) == ([[], []], [])
    with session_scope(engine) as s:
        lease = s.get(RunLease, cascade_id)
        assert lease is not None
        lease.expires_at = utcnow() - timedelta(seconds=1)
    # its runner died before applying it: abort again ends the stalled stage at once
    assert _offered(api, cascade_id) == ([[], []], ["abort"])
    status, out = api.call("POST", f"/api/cascades/{cascade_id}/abort", token=WRITE_TOKEN)
    assert status == 200 and out["changed"]
    assert _offered(api, cascade_id) == ([[], []], [])
    with session_scope(engine) as s:
        assert s.get(Stage, second).state == "aborted"  # type: ignore[union-attr]


def test_whoami(served: tuple[ApiServer, Engine]) -> None:
    api, _ = served
    assert api.call("GET", "/api/whoami") == (401, {"detail": "a bearer token is required"})
    assert api.call("GET", "/api/whoami", token="not-a-token-at-all") == (401, {"detail": "invalid token"})
    assert api.call("GET", "/api/whoami", token=READ_TOKEN) == (
        200, {"name": "viewer", "role": "read", "can_write": False},
    )  # fmt: skip
    assert api.call("GET", "/api/whoami", token=WRITE_TOKEN) == (
        200, {"name": "alice", "role": "write", "can_write": True},
    )  # fmt: skip
    assert WRITE_TOKEN not in api.log() and READ_TOKEN not in api.log()

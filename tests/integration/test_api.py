"""The control plane as a real server (subprocess, free port) on the local Postgres, migrated
from an empty schema at start-up: every route, every command from every stage state, auth,
idempotency, concurrent starts, config errors naming the field, and no secret in the logs.

Stage moves that belong to a runner (paused, completed, failed) are made through
`cascade.store.repo` on the same database, as the runner would; tests/e2e/test_control_plane.py
drives a real embedded runner instead.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_procs import READ_TOKEN, WRITE_TOKEN, ApiServer, fresh_schema, running_api, tiny_config
from api_seed import seed
from sqlalchemy import Engine, select

from cascade.config import ConfigError, parse_cascade_config, with_resolved_paths
from cascade.store import leases, migrate, repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Run

pytestmark = pytest.mark.postgres
COMMANDS = ("start", "pause", "resume", "advance")


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with running_api(db_url, tmp_path_factory.mktemp("api")) as server:
        yield server


@pytest.fixture(scope="module")
def engine(api: ApiServer, db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def create(api: ApiServer, cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg or tiny_config())
    assert status == 201, body
    return body


def command(api: ApiServer, stage_id: int, name: str, token: str | None = WRITE_TOKEN) -> tuple[int, Any]:
    return api.call("POST", f"/api/stages/{stage_id}/{name}", token=token)


def runner_moves(engine: Engine, stage_id: int, *states: str) -> None:
    for state in states:
        with session_scope(engine) as s:
            repo.transition_stage(s, stage_id=stage_id, to_state=state, actor="runner")


def events_of(api: ApiServer, cascade_id: int) -> list[dict[str, Any]]:
    status, body = api.call("GET", f"/api/cascades/{cascade_id}/events")
    assert status == 200
    return body


# --------------------------------------------------------------------------- serving


def test_migrated_from_empty_and_serving(api: ApiServer, engine: Engine) -> None:
    assert migrate.current_revision(engine) == migrate.head_revision()
    status, health = api.call("GET", "/health")
    assert (status, health) == (
        200,
        {"status": "ok", "database": "ok", "schema_revision": migrate.head_revision()},
    )
    status, doc = api.call("GET", "/openapi.json")
    assert status == 200
    paths = set(doc["paths"])
    subs = ("", "/stages", "/metrics", "/evals", "/checkpoints", "/regression", "/reasons", "/events")
    subs += ("/config", "/completions")
    for sub in subs:
        assert f"/api/cascades/{{cascade_id}}{sub}" in paths
    assert set(doc["paths"]["/api/cascades/{cascade_id}"]) == {"get", "delete"}
    for cmd in COMMANDS:
        assert f"/api/stages/{{stage_id}}/{cmd}" in paths
        assert f"/api/cascades/{{cascade_id}}/stages/{{stage}}/{cmd}" in paths
    assert "CascadeConfig" in doc["components"]["schemas"]
    status, page = api.call("GET", "/")
    assert status == 200 and "<title>Cascade control plane</title>" in page
    status, _ = api.call("GET", "/static/dashboard.js")
    assert status == 200
    status, metrics = api.call("GET", "/metrics")
    assert status == 200
    assert 'cascade_api_requests_total{method="GET",route="/health",status="200"}' in metrics


# --------------------------------------------------------------------------- create


def test_create_from_json_and_yaml(api: ApiServer) -> None:
    cfg = tiny_config("from-json")
    body = create(api, cfg)
    assert body["name"] == "from-json" and body["status"] == "pending" and body["runs"] == []
    assert [(s["index"], s["name"], s["state"], s["max_steps"]) for s in body["stages"]] == [
        (0, "math", "pending", 10), (1, "code", "pending", 10), (2, "if", "pending", 10),
    ]  # fmt: skip
    # stored with its paths resolved from the server's base_dir (services/api/paths.py)
    resolved = with_resolved_paths(parse_cascade_config(cfg), api.base_dir)
    assert body["config"] == resolved.model_dump(mode="json")
    assert body["config"]["model"]["path"] == str(api.base_dir / "models" / "tiny")
    text = yaml.safe_dump(tiny_config("from-yaml"))
    status, out = api.call(
        "POST", "/api/cascades", token=WRITE_TOKEN, body=text.encode(), content_type="application/yaml"
    )
    assert status == 201 and out["name"] == "from-yaml"
    status, listed = api.call("GET", "/api/cascades?limit=2")
    assert status == 200 and [c["name"] for c in listed] == ["from-yaml", "from-json"]
    status, got = api.call("GET", f"/api/cascades/{body['id']}")
    assert status == 200 and got == body
    status, stages = api.call("GET", f"/api/cascades/{body['id']}/stages")
    assert status == 200 and stages == body["stages"]
    status, stage = api.call("GET", f"/api/stages/{body['stages'][1]['id']}")
    assert status == 200 and stage == body["stages"][1]
    created = [e for e in events_of(api, body["id"]) if e["kind"] == "created"]
    assert [e["actor"] for e in created] == ["api:alice"]


def _bad(edit: Any) -> dict[str, Any]:
    cfg = tiny_config()
    edit(cfg)
    return cfg


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        (_bad(lambda c: c["stages"][0].update(grpo={"group_size": 1})), "stages.0.grpo.group_size"),
        (_bad(lambda c: c.update(learning_rate=1)), "learning_rate"),
        (_bad(lambda c: c.pop("model")), "model"),
        (_bad(lambda c: c.update(name="has space")), "name"),
        (_bad(lambda c: c.update(name="x" * 201)), "name"),
        (_bad(lambda c: c["stages"][1].update(name="\x00")), "stages.1.name"),
        (_bad(lambda c: c["stages"].append({"domain": "swe"})), "<root>"),
        ([1, 2], "<root>"),
    ],
)
def test_create_rejects_invalid_config_naming_the_field(api: ApiServer, cfg: Any, field: str) -> None:
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 422, body
    assert body["field"] == field
    assert body["detail"].startswith(f"body: {field}: ")
    if field != "name" and field != "stages.1.name":  # the CLI prints the same line
        with pytest.raises(ConfigError) as err:
            parse_cascade_config(cfg, "body")
        assert str(err.value) == body["detail"]


def test_create_rejects_bad_bodies(api: ApiServer) -> None:
    dup = b"name: a\nname: b\n"
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, body=dup, content_type="text/yaml")
    assert status == 422 and "duplicate key 'name'" in body["detail"] and body["field"] is None
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, body=b"{not json")
    assert status == 422 and body["detail"].startswith("body: invalid JSON")
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, body=b"x", content_type="text/plain")
    assert status == 415
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, body=b" " * 1_000_001)
    assert status == 413


# --------------------------------------------------------------------------- auth


def test_auth_on_every_mutating_route(api: ApiServer) -> None:
    body = create(api)
    cascade_id, stage_id = body["id"], body["stages"][0]["id"]
    routes = [("/api/cascades", tiny_config()), (f"/api/cascades/{cascade_id}/abort", None)]
    routes += [(f"/api/stages/{stage_id}/{cmd}", None) for cmd in COMMANDS]
    for path, payload in routes:
        status, out = api.call("POST", path, json_body=payload)
        assert status == 401 and out == {"detail": "a bearer token is required"}, path
        status, out = api.call("POST", path, token="not-a-token-at-all", json_body=payload)
        assert status == 401 and out == {"detail": "invalid token"}, path
        status, out = api.call("POST", path, token=READ_TOKEN, json_body=payload)
        assert status == 403 and out == {"detail": "token 'viewer' is read-only"}, path
    status, got = api.call("GET", f"/api/cascades/{cascade_id}")
    assert got["status"] == "pending" and {s["state"] for s in got["stages"]} == {"pending"}
    assert [e["kind"] for e in events_of(api, cascade_id)] == ["created"]  # refused: nothing logged


# --------------------------------------------------------------------------- state machine


# (state the stage is in, command) -> (HTTP status, state after, desired_state after)
EXPECTED = {
    ("pending", "start"): (200, "running", None),
    ("pending", "pause"): (409, "pending", None),
    ("pending", "resume"): (409, "pending", None),
    ("pending", "advance"): (409, "pending", None),
    ("running", "start"): (200, "running", None),
    ("running", "pause"): (200, "running", "paused"),
    ("running", "resume"): (200, "running", None),
    ("running", "advance"): (200, "running", "completed"),
    ("paused", "start"): (409, "paused", None),
    ("paused", "pause"): (200, "paused", None),
    ("paused", "resume"): (200, "paused", "running"),
    ("paused", "advance"): (409, "paused", None),
    ("completed", "advance"): (200, "completed", None),
}
for _state in ("completed", "failed", "aborted"):
    for _cmd in COMMANDS:
        EXPECTED.setdefault((_state, _cmd), (409, _state, None))
SETUP = {
    "pending": [],
    "running": ["running"],
    "paused": ["running", "paused"],
    "completed": ["running", "completed"],
    "failed": ["running", "failed"],
    "aborted": ["running", "aborted"],
}


@pytest.mark.parametrize(("state", "cmd"), sorted(EXPECTED))
def test_every_command_from_every_state(api: ApiServer, engine: Engine, state: str, cmd: str) -> None:
    body = create(api, tiny_config(stages=("math",)))
    stage_id = body["stages"][0]["id"]
    runner_moves(engine, stage_id, *SETUP[state])
    before = events_of(api, body["id"])
    code, want_state, want_desired = EXPECTED[(state, cmd)]
    status, out = command(api, stage_id, cmd)
    assert status == code, out
    _, stage = api.call("GET", f"/api/stages/{stage_id}")
    assert (stage["state"], stage["desired_state"]) == (want_state, want_desired)
    new = events_of(api, body["id"])[len(before) :]
    if status == 409:
        assert out["current_state"] == state and out["requested_state"]
        assert new == []  # a refused move leaves no trace
        return
    assert out["stage"] == stage
    assert out["changed"] == bool(new)
    assert all(e["actor"] == "api:alice" for e in new)
    # Idempotent: the same request again changes nothing and logs nothing.
    status, again = command(api, stage_id, cmd)
    assert status == 200 and again["changed"] is False and again["stage"] == stage
    assert len(events_of(api, body["id"])) == len(before) + len(new)


def test_runner_applies_requests_and_resume_withdraws_a_pause(api: ApiServer, engine: Engine) -> None:
    body = create(api, tiny_config(stages=("math",)))
    stage_id = body["stages"][0]["id"]
    assert command(api, stage_id, "start")[0] == 200
    assert command(api, stage_id, "pause")[1]["stage"]["desired_state"] == "paused"
    _, out = command(api, stage_id, "resume")  # not applied yet: the pause is withdrawn
    assert out["changed"] and out["stage"]["desired_state"] is None
    command(api, stage_id, "pause")
    runner_moves(engine, stage_id, "paused")  # the runner's step boundary, after its checkpoint
    _, stage = api.call("GET", f"/api/stages/{stage_id}")
    assert (stage["state"], stage["desired_state"]) == ("paused", None)
    command(api, stage_id, "resume")
    runner_moves(engine, stage_id, "running")
    _, stage = api.call("GET", f"/api/stages/{stage_id}")
    assert (stage["state"], stage["desired_state"]) == ("running", None)
    kinds = [(e["kind"], e["to_state"], e["actor"]) for e in events_of(api, body["id"]) if e["stage_id"]]
    assert kinds == [
        ("transition", "running", "api:alice"),
        ("request", "paused", "api:alice"),
        ("request", "running", "api:alice"),
        ("request", "paused", "api:alice"),
        ("transition", "paused", "runner"),
        ("request", "running", "api:alice"),
        ("transition", "running", "runner"),
    ]


def test_stages_start_in_order_one_at_a_time(api: ApiServer, engine: Engine) -> None:
    body = create(api)
    first, second, _ = (s["id"] for s in body["stages"])
    status, out = command(api, second, "start")
    assert status == 409 and out["current_state"] == "pending"
    assert out["detail"] == "stage 'math' (pending) must finish first: stages run in order"
    assert command(api, first, "start")[0] == 200
    assert command(api, second, "start")[0] == 409
    runner_moves(engine, first, "completed")
    status, out = command(api, second, "start")
    assert status == 200 and out["changed"] and out["stage"]["state"] == "running"
    _, got = api.call("GET", f"/api/cascades/{body['id']}")
    assert got["status"] == "running"


def test_concurrent_starts_only_one_wins(api: ApiServer) -> None:
    body = create(api)
    stage_id = body["stages"][0]["id"]
    n = 8
    barrier = threading.Barrier(n)
    results: list[tuple[int, Any]] = []

    def go() -> None:
        barrier.wait()
        results.append(command(api, stage_id, "start"))

    threads = [threading.Thread(target=go) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [status for status, _ in results] == [200] * n
    assert sum(out["changed"] for _, out in results) == 1
    transitions = [e for e in events_of(api, body["id"]) if e["kind"] == "transition"]
    assert [(e["from_state"], e["to_state"]) for e in transitions] == [("pending", "running")]


def test_abort_cascade(api: ApiServer, engine: Engine) -> None:
    idle = create(api)  # no runner attached: the running stage aborts at once too
    command(api, idle["stages"][0]["id"], "start")
    status, out = api.call("POST", f"/api/cascades/{idle['id']}/abort", token=WRITE_TOKEN)
    assert status == 200 and out["changed"] and out["cascade"]["status"] == "aborted"
    _, got = api.call("GET", f"/api/cascades/{idle['id']}")
    assert [(s["state"], s["desired_state"]) for s in got["stages"]] == [("aborted", None)] * 3

    body = create(api)  # a live runner attached: its running stage aborts at its next step boundary
    cascade_id = body["id"]
    first = body["stages"][0]["id"]
    command(api, first, "start")
    holder = leases.Holder(token=uuid.uuid4().hex, host="test-host", pid=1)
    with session_scope(engine) as s:
        leases.acquire(s, cascade_id=cascade_id, run_id=None, holder=holder, expiry_s=600)
    status, out = api.call("POST", f"/api/cascades/{cascade_id}/abort", token=WRITE_TOKEN)
    assert status == 200 and out["changed"] and out["cascade"]["status"] == "aborted"
    _, got = api.call("GET", f"/api/cascades/{cascade_id}")
    states = [(s["state"], s["desired_state"]) for s in got["stages"]]
    assert states == [("running", "aborted"), ("aborted", None), ("aborted", None)]
    status, out = command(api, first, "pause")  # an abort cannot be replaced by a pause
    assert status == 409 and out["current_state"] == "running"
    status, out = api.call("POST", f"/api/cascades/{cascade_id}/abort", token=WRITE_TOKEN)
    assert status == 200 and not out["changed"]
    runner_moves(engine, first, "aborted")
    with session_scope(engine) as s:
        leases.release(s, cascade_id=cascade_id, token=holder.token)
    _, got = api.call("GET", f"/api/cascades/{cascade_id}")
    assert [s["state"] for s in got["stages"]] == ["aborted"] * 3
    done = create(api, tiny_config(stages=("math",)))
    with session_scope(engine) as s:
        repo.set_cascade_status(s, cascade_id=done["id"], status="completed", actor="runner")
    status, out = api.call("POST", f"/api/cascades/{done['id']}/abort", token=WRITE_TOKEN)
    assert status == 409 and out["current_state"] == "completed"


# --------------------------------------------------------------------------- reads with data


def test_reads_of_a_run(api: ApiServer, db_url: str) -> None:
    cascade_id = seed(db_url, name="seeded")
    base = f"/api/cascades/{cascade_id}"
    _, detail = api.call("GET", base)
    assert [s["state"] for s in detail["stages"]] == ["completed", "completed", "running"]
    assert [s["steps_done"] for s in detail["stages"]] == [60, 60, 40]
    run_id = detail["runs"][0]["id"]
    status, metrics = api.call("GET", f"{base}/metrics")
    assert status == 200 and metrics["run_id"] == run_id
    assert [s["global_step"] for s in metrics["steps"]] == list(range(1, 161))
    _, tail = api.call("GET", f"{base}/metrics?after_global_step=150&limit=5")
    assert [s["global_step"] for s in tail["steps"]] == [151, 152, 153, 154, 155]
    _, evals = api.call("GET", f"{base}/evals?run_id={run_id}")
    assert len(evals["evals"]) == 3 * (7 + 6 + 4)
    for e in evals["evals"]:  # every score with its interval, and every metric too
        assert e["low"] <= e["score"] <= e["high"]
        assert e["metrics"]["greedy"]["method"] == "wilson"
        assert (e["metrics"]["greedy"]["low"], e["metrics"]["greedy"]["high"]) == (e["low"], e["high"])
    _, table = api.call("GET", f"{base}/regression")
    assert table["stages"] == ["math", "code", "if"]
    assert "interval" in table["noise_rule"]
    math_row = next(r for r in table["rows"] if r["domain"] == "math")
    assert math_row["start"] == pytest.approx(0.16)
    assert math_row["final_minus_best"] == pytest.approx(math_row["final"] - math_row["best"])
    for row in table["rows"]:
        assert row["start_ci"][0] <= row["start"] <= row["start_ci"][1]
        assert row["best_ci"][0] <= row["best"] <= row["best_ci"][1]
        assert row["final_ci"][0] <= row["final"] <= row["final_ci"][1]
        assert set(row["after_ci"]) == {"math", "code", "if"}
        assert row["drop_outside_noise"] == (row["final_ci"][1] < row["best_ci"][0])
    _, reasons = api.call("GET", f"{base}/reasons")
    assert set(reasons["training"]) == {"math", "code", "if"}
    assert sum(reasons["training"]["math"].values()) == 60 * 16
    assert sum(reasons["eval"]["code"].values()) == 256
    _, ckpts = api.call("GET", f"{base}/checkpoints")
    teachers = {c["domain"] for c in ckpts if c["is_teacher"]}
    assert teachers == {"math", "code", "if"}
    _, events = api.call("GET", f"{base}/events?limit=3")
    assert len(events) == 3 and events == sorted(events, key=lambda e: e["id"])
    _, later = api.call("GET", f"{base}/events?after_id={events[-1]['id']}")
    assert later == []


def _completion(g: int, **extra: Any) -> dict[str, Any]:
    return {
        "global_step": g, "stage": "math", "domain": "math", "problem": f"p{g}", "prompt": f"What is {g}+1?",
        "completion": f"<b>{g + 1}</b>", "reward": 1.0, "reason": "ok", "detail": "", "finish": "stop",
        "tokens": 7, **extra,
    }  # fmt: skip


def test_latest_completions(api: ApiServer, db_url: str, engine: Engine) -> None:
    """`completions.jsonl` in the run's directory (relative `runs/logged`, from the API's base
    dir): its tail, oldest first; a cut last line and a NaN reward do not break it; no file, a
    directory outside the runs root or a log linked out of it is an empty list with a note."""
    cascade_id = seed(db_url, name="logged")
    base = f"/api/cascades/{cascade_id}/completions"
    status, out = api.call("GET", base)
    assert status == 200 and out["completions"] == [] and "no completions logged yet" in out["note"]
    run_dir = api.base_dir / "runs" / "logged"
    run_dir.mkdir(parents=True)
    lines = [json.dumps(_completion(g)) for g in range(1, 26)]
    lines[-2] = json.dumps(_completion(24, reward=float("nan"), reason="wrong_answer", problem=24))
    (run_dir / "completions.jsonl").write_text("\n".join(lines) + '\n{"global_step": 26, "prom')
    status, out = api.call("GET", base)
    assert status == 200 and out["note"] is None and out["run_id"] is not None
    assert [c["global_step"] for c in out["completions"]] == list(range(6, 26))  # the last 20
    assert out["completions"][-1] == {**_completion(25), "problem": "p25"}
    assert out["completions"][-2]["reward"] is None and out["completions"][-2]["problem"] == "24"
    _, out = api.call("GET", f"{base}?last=3&run_id={out['run_id']}")
    assert [c["global_step"] for c in out["completions"]] == [23, 24, 25]
    for bad in ("last=0", "last=201", "last=x"):
        assert api.call("GET", f"{base}?{bad}")[0] == 422, bad
    assert api.call("GET", f"/api/cascades/{cascade_id}/completions?run_id=999999")[0] == 404
    assert api.call("GET", "/api/cascades/999999/completions")[0] == 404

    # A log that is a symlink out of the runs root is not followed.
    (run_dir / "completions.jsonl").unlink()
    (run_dir / "completions.jsonl").symlink_to("/etc/hostname")
    status, out = api.call("GET", base)
    assert status == 200 and out["completions"] == [] and "outside the API's runs root" in out["note"]
    # A run directory outside the runs root (a CLI run elsewhere) is not read at all.
    with session_scope(engine) as s:
        run = s.scalars(select(Run).where(Run.cascade_id == cascade_id)).one()
        run.output_dir = "/etc"
    status, out = api.call("GET", base)
    assert status == 200 and out["completions"] == [] and "outside the API's runs root" in out["note"]
    # A cascade with no run yet.
    other = create(api)
    status, out = api.call("GET", f"/api/cascades/{other['id']}/completions")
    assert (status, out) == (200, {"run_id": None, "completions": [], "note": "no run yet"})


def test_not_found(api: ApiServer) -> None:
    other = create(api)
    for path in ("/api/cascades/999999", "/api/cascades/999999/evals", "/api/stages/999999"):
        status, out = api.call("GET", path)
        assert status == 404 and "does not exist" in out["detail"], path
    status, out = api.call("GET", f"/api/cascades/{other['id']}/metrics?run_id=1")
    assert status == 404 and out["detail"] == f"run 1 is not a run of cascade {other['id']}"
    assert command(api, 999999, "start")[0] == 404
    status, _ = api.call("GET", "/api/cascades/0")
    assert status == 422


# --------------------------------------------------------------------------- CLI


def test_cli_talks_to_the_api(
    api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.cli.main import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config("cli")))
    monkeypatch.setenv("CASCADE_API_URL", api.url)
    monkeypatch.setenv("CASCADE_API_TOKEN", WRITE_TOKEN)
    assert main(["api", "create", str(cfg)]) == 0
    out = capsys.readouterr().out
    cascade_id = int(out.split()[2])
    _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    first = detail["stages"][0]["id"]
    assert main(["stage", "pause", str(first)]) == 1
    assert "HTTP 409" in capsys.readouterr().err
    assert main(["stage", "start", str(first)]) == 0
    assert "running" in capsys.readouterr().out
    assert main(["stage", "start", str(first)]) == 0
    assert "no change" in capsys.readouterr().out
    assert main(["stage", "advance", str(first)]) == 0
    assert main(["api", "show", str(cascade_id)]) == 0
    assert "(requested: completed)" in capsys.readouterr().out
    assert main(["api", "list"]) == 0
    assert "cli" in capsys.readouterr().out
    assert main(["stage", "pause", str(first), "--token", READ_TOKEN]) == 2
    assert "read-only" in capsys.readouterr().err
    assert main(["api", "abort", str(cascade_id)]) == 0
    assert "aborted" in capsys.readouterr().out
    assert WRITE_TOKEN not in capsys.readouterr().out


# --------------------------------------------------------------------------- last: the logs


def test_no_secret_in_the_server_log(api: ApiServer) -> None:
    """Runs last in this module: every request above (bad tokens included) is in the log."""
    log = api.log()
    assert "POST /api/stages/" in log  # the access log is there...
    for secret in (WRITE_TOKEN, READ_TOKEN, "not-a-token-at-all"):
        assert secret not in log  # ...and no token ever is
    assert "alice (write), viewer (read)" in log


def test_settings_errors_never_show_a_token(tmp_path: Path) -> None:
    from services.api.settings import SettingsError, TokenTable, load_settings

    short = "tiny-secret-9"
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump({"tokens": [{"name": "a", "role": "write", "token": short}]}))
    with pytest.raises(SettingsError, match="tokens.a: a token needs at least 16 characters") as err:
        TokenTable.from_settings(load_settings(path))
    assert short not in str(err.value)
    bad_role = {"name": "a", "role": "admin", "token": "s3cret-s3cret-s3cret"}
    path.write_text(yaml.safe_dump({"tokens": [bad_role]}))
    with pytest.raises(SettingsError, match=r"tokens\.0\.role: Input should be 'read' or 'write'") as err:
        load_settings(path)
    assert "s3cret" not in str(err.value)


def test_cli_run_cascade_id_needs_db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cascade.cli.main import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config("cli")))
    assert main(["run", str(cfg), "--cascade-id", "1"]) == 2
    assert "--cascade-id needs --db" in capsys.readouterr().err

"""The control plane against hostile and operator inputs, through a real server process on its
own fresh Postgres schema (with small `limits` in its settings, so the bounds are cheap to hit):

- no request body gives a 500: deeply nested JSON and YAML (2 KB, 1000 levels) are 422 naming
  the nesting bound, an oversized body is 413 naming the size bound (also when it streams in
  chunks with no Content-Length), a cascade with more stages than the cap is 422 naming it; every
  answer is counted in `cascade_api_requests_total`, and the log has no traceback;
- stage commands addressed by cascade and stage name or index;
- `DELETE /api/cascades/{id}`: refused (409) while the cascade is pending or running, while a run
  of it runs, while a live runner holds its lease; else every row under it goes, in one
  transaction; and `cascade api delete`;
- `GET /api/cascades/{id}/config`: the stored config and its hash;
- a created config's paths are resolved and confined to the settings' roots (`paths`): `/etc`,
  `../../..`, `/etc/shadow`, a symlink out of a root, a local MLflow store elsewhere, a name
  `..`, an `output_dir` inside another run: 422 naming the field, nothing stored; what is
  admitted is stored resolved;
- `/health` answers 503 while the database is down (a private Postgres, stopped and started);
- any method name and any path leave `/metrics`' series as they were (`other`, `unmatched`);
- secrets in a stored config (a URL's password, keys named like tokens) are masked in every
  answer the API and the dashboard read, and kept in the database for the runner;
- a request body that stalls or trickles is cut at `limits.body_timeout_s` (408, closed);
- every answer carries `nosniff` and frame-denying headers (`/docs`, JSON, errors, files).
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_procs import READ_TOKEN, REPO, WRITE_TOKEN, ApiServer, fresh_schema, running_api, tiny_config
from api_seed import seed
from sqlalchemy import Engine, func, select

from cascade.store import leases, repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Cascade, Checkpoint, Eval, Event, Run, RunLease, Stage, Step

pytestmark = pytest.mark.postgres
MAX_BODY = 100_000
MAX_STAGES = 6
DEEP = 1000
BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's base_dir; its roots are runs/, models/ and data/ in it."""
    return tmp_path_factory.mktemp("confined").resolve()


@pytest.fixture(scope="module")
def api(db_url: str, base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    limits = {
        "max_body_bytes": MAX_BODY,
        "max_stages_per_cascade": MAX_STAGES,
        "body_timeout_s": BODY_TIMEOUT_S,
    }
    paths = {"base_dir": str(base), "runs_root": "runs", "model_roots": ["models"], "data_roots": ["data"]}
    with running_api(
        db_url, tmp_path_factory.mktemp("api"), extra={"limits": limits, "paths": paths}
    ) as server:
        yield server


@pytest.fixture(scope="module")
def engine(api: ApiServer, db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def post_config(api: ApiServer, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
    return api.call("POST", "/api/cascades", token=WRITE_TOKEN, body=body, content_type=content_type)


def counted(api: ApiServer, method: str, route: str, status: int) -> float:
    _, text = api.call("GET", "/metrics")
    labels = f'method="{method}",route="{route}",status="{status}"'
    found = re.search(rf"^cascade_api_requests_total\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def create(api: ApiServer, cfg: dict[str, Any]) -> dict[str, Any]:
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 201, body
    return body


# --------------------------------------------------------------------------- bounded bodies


DEEP_BODIES = {
    "json-lists": ("application/json", "[" * DEEP + "]" * DEEP),
    "json-objects": ("application/json", '{"a":' * DEEP + "1" + "}" * DEEP),
    "json-in-a-field": ("application/json", '{"name": "x", "model": ' + "[" * DEEP + "]" * DEEP + "}"),
    "yaml-flow": ("application/yaml", "[" * DEEP + "]" * DEEP),
    "yaml-flow-mappings": ("application/yaml", "{a: " * DEEP + "1" + "}" * DEEP),
    # block style indents once per level: 300 levels, one space each (45 KB)
    "yaml-block": ("application/yaml", "".join(" " * i + "a:\n" for i in range(300)) + " " * 300 + "1\n"),
    "yaml-sequences": ("application/yaml", "- " * DEEP + "1\n"),
}


@pytest.mark.parametrize("case", sorted(DEEP_BODIES))
def test_deep_nesting_is_a_422_naming_the_bound(api: ApiServer, case: str) -> None:
    content_type, text = DEEP_BODIES[case]
    before = counted(api, "POST", "/api/cascades", 422)
    status, body = post_config(api, text.encode(), content_type)
    assert status == 422, body
    assert "nested deeper than 64 levels" in body["detail"], body
    assert body["detail"].startswith("body: invalid ") and body["field"] is None
    assert counted(api, "POST", "/api/cascades", 422) == before + 1
    assert counted(api, "POST", "/api/cascades", 500) == 0


def test_nesting_within_the_bound_is_judged_by_the_models(api: ApiServer) -> None:
    """64 levels pass the parser; the models then refuse the shape, naming the field."""
    cfg = tiny_config("nested-ok")
    cfg["stages"][0]["advance"] = {"max_steps": json.loads("[" * 60 + "]" * 60)}
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 422 and body["field"] == "stages.0.advance.max_steps", body


def test_body_size_bound_is_a_413_naming_it(api: ApiServer) -> None:
    before = counted(api, "POST", "/api/cascades", 413)
    status, body = post_config(api, b" " * (MAX_BODY + 1))
    assert status == 413
    assert body["detail"] == f"request body larger than {MAX_BODY} bytes (the API's limits.max_body_bytes)"
    # Streamed in chunks with no Content-Length: cut off once past the bound.
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    headers = {"Authorization": f"Bearer {WRITE_TOKEN}", "Content-Type": "application/yaml"}
    chunks = (b"# " + b"x" * 9_997 + b"\n" for _ in range(50))  # 500 KB in 10 KB chunks
    try:
        conn.request("POST", "/api/cascades", body=chunks, headers=headers, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and b"limits.max_body_bytes" in resp.read()
    finally:
        conn.close()
    assert counted(api, "POST", "/api/cascades", 413) == before + 2
    # Just under the bound is parsed as usual.
    status, body = post_config(
        api, yaml.safe_dump(tiny_config("padded")).encode() + b"#" * 90_000, "text/yaml"
    )
    assert status == 201, body


def test_stage_cap_is_a_422_naming_it(api: ApiServer) -> None:
    def config(n: int) -> dict[str, Any]:
        cfg = tiny_config(f"cap-{n}", stages=("math",))
        cfg["stages"] = [{"name": f"s{i}", "domain": "math"} for i in range(n)]
        return cfg

    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=config(MAX_STAGES))
    assert status == 201 and len(body["stages"]) == MAX_STAGES
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=config(MAX_STAGES + 1))
    assert status == 422 and body["field"] == "stages"
    assert body["detail"] == (
        f"body: stages: at most {MAX_STAGES} stages per cascade (the API's limits.max_stages_per_cascade), "
        f"got {MAX_STAGES + 1}"
    )
    # YAML aliases cannot multiply stages past the cap either.
    text = "name: alias\nmodel: {path: m}\ndomains: [{name: math}]\nx: &s {domain: math}\n"
    text += "stages: [" + ", ".join(["*s"] * 3000) + "]\n"
    status, body = post_config(api, text.encode(), "application/yaml")
    assert status == 422, body


def test_no_traceback_in_the_log(api: ApiServer) -> None:
    """After the hostile bodies above: nothing reached a 500 or a traceback."""
    log = api.log()
    assert "Traceback" not in log and "RecursionError" not in log
    _, metrics = api.call("GET", "/metrics")
    assert 'status="500"' not in metrics


# --------------------------------------------------------------------------- stored config


def test_config_endpoint(api: ApiServer) -> None:
    body = create(api, tiny_config("with-config"))
    status, out = api.call("GET", f"/api/cascades/{body['id']}/config")
    assert status == 200
    assert out["cascade_id"] == body["id"] and out["config"] == body["config"]
    assert re.fullmatch(r"[0-9a-f]{64}", out["config_hash"])
    assert api.call("GET", "/api/cascades/999999/config")[0] == 404


# --------------------------------------------------------------------------- stages by name


def test_stage_commands_by_cascade_and_name_or_index(api: ApiServer) -> None:
    one = create(api, tiny_config("by-name-1"))
    two = create(api, tiny_config("by-name-2"))
    base = f"/api/cascades/{two['id']}/stages"
    status, out = api.call("POST", f"{base}/math/start", token=WRITE_TOKEN)
    assert status == 200 and out["changed"] and out["stage"]["id"] == two["stages"][0]["id"]
    _, first = api.call("GET", f"/api/cascades/{one['id']}")
    assert first["stages"][0]["state"] == "pending"  # the other cascade's math is untouched
    status, out = api.call("POST", f"{base}/0/pause", token=WRITE_TOKEN)  # by index
    assert status == 200 and out["stage"]["desired_state"] == "paused"
    status, stage = api.call("GET", f"{base}/math")
    assert status == 200 and stage == out["stage"]
    assert api.call("GET", f"{base}/2")[1]["name"] == "if"
    status, out = api.call("POST", f"{base}/code/start", token=WRITE_TOKEN)
    assert status == 409 and out["current_state"] == "pending"
    status, out = api.call("POST", f"{base}/swe/start", token=WRITE_TOKEN)
    assert status == 404 and out["detail"] == (
        f"cascade {two['id']} has no stage named 'swe' nor at that index (its stages: math, code, if)"
    )
    assert api.call("POST", f"{base}/3/start", token=WRITE_TOKEN)[0] == 404
    assert api.call("POST", "/api/cascades/999999/stages/math/start", token=WRITE_TOKEN)[0] == 404
    assert api.call("POST", f"{base}/math/resume")[0] == 401
    assert api.call("POST", f"{base}/math/resume", token=READ_TOKEN)[0] == 403
    # A name wins over an index: the stage named "1" is index 0.
    cfg = tiny_config("numeric-names", stages=("math", "code"))
    cfg["stages"][0]["name"] = "1"
    three = create(api, cfg)
    _, stage = api.call("GET", f"/api/cascades/{three['id']}/stages/1")
    assert (stage["index"], stage["name"]) == (0, "1")
    _, stage = api.call("GET", f"/api/cascades/{three['id']}/stages/code")
    assert stage["index"] == 1


def test_cli_stage_by_cascade_and_name(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.cli.main import main

    body = create(api, tiny_config("cli-by-name"))
    monkeypatch.setenv("CASCADE_API_URL", api.url)
    monkeypatch.setenv("CASCADE_API_TOKEN", WRITE_TOKEN)
    assert main(["stage", "start", "--cascade", str(body["id"]), "--stage", "math"]) == 0
    assert "math" in capsys.readouterr().out
    assert main(["stage", "pause", "--cascade", str(body["id"]), "--stage", "0"]) == 0
    assert "(requested: paused)" in capsys.readouterr().out
    assert main(["stage", "resume", str(body["stages"][0]["id"])]) == 0  # the global id still works
    capsys.readouterr()
    for bad in (["stage", "pause"], ["stage", "pause", "1", "--cascade", "1", "--stage", "math"],
                ["stage", "pause", "--cascade", "1"]):  # fmt: skip
        assert main(bad) == 2
        assert "name the stage by its id" in capsys.readouterr().err
    assert main(["stage", "pause", "--cascade", str(body["id"]), "--stage", "nope"]) == 1
    assert "has no stage named 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------- delete


def rows_of(engine: Engine, cascade_id: int) -> dict[str, int]:
    with session_scope(engine) as s:
        run_ids = select(Run.id).where(Run.cascade_id == cascade_id)
        return {
            "cascades": s.scalar(select(func.count()).where(Cascade.id == cascade_id)) or 0,
            "stages": s.scalar(select(func.count()).where(Stage.cascade_id == cascade_id)) or 0,
            "runs": s.scalar(select(func.count()).where(Run.cascade_id == cascade_id)) or 0,
            "steps": s.scalar(select(func.count()).where(Step.run_id.in_(run_ids))) or 0,
            "evals": s.scalar(select(func.count()).where(Eval.run_id.in_(run_ids))) or 0,
            "checkpoints": s.scalar(select(func.count()).where(Checkpoint.run_id.in_(run_ids))) or 0,
            "events": s.scalar(select(func.count()).where(Event.cascade_id == cascade_id)) or 0,
            "leases": s.scalar(select(func.count()).where(RunLease.cascade_id == cascade_id)) or 0,
        }


def delete(api: ApiServer, cascade_id: int, token: str | None = WRITE_TOKEN) -> tuple[int, Any]:
    return api.call("DELETE", f"/api/cascades/{cascade_id}", token=token)


def test_delete_a_finished_cascade_with_everything_under_it(
    api: ApiServer, db_url: str, engine: Engine
) -> None:
    other = seed(db_url, name="kept")
    cascade_id = seed(db_url, name="doomed")
    kept_before = rows_of(engine, other)
    assert delete(api, cascade_id, None)[0] == 401
    assert delete(api, cascade_id, READ_TOKEN)[0] == 403
    status, out = delete(api, cascade_id)  # running, its last stage running
    assert status == 409 and out["current_state"] == "running" and "abort it first" in out["detail"]
    status, out = api.call("POST", f"/api/cascades/{cascade_id}/abort", token=WRITE_TOKEN)
    assert status == 200 and out["cascade"]["status"] == "aborted"  # no runner: applied at once
    before = rows_of(engine, cascade_id)
    assert all(n > 0 for table, n in before.items() if table != "leases"), before
    status, out = delete(api, cascade_id)
    assert status == 200, out
    assert out == {"cascade_id": cascade_id, "deleted": before}
    assert set(rows_of(engine, cascade_id).values()) == {0}
    assert rows_of(engine, other) == kept_before  # another cascade's rows are untouched
    assert api.call("GET", f"/api/cascades/{cascade_id}")[0] == 404
    assert delete(api, cascade_id)[0] == 404
    assert f"cascade {cascade_id} deleted by api:alice" in api.log()


def test_delete_refused_while_pending_running_or_held(api: ApiServer, engine: Engine) -> None:
    body = create(api, tiny_config("refused", stages=("math",)))
    cascade_id = body["id"]
    status, out = delete(api, cascade_id)
    assert status == 409 and out["current_state"] == "pending" and out["requested_state"] == "deleted"
    # Aborted, but a run still running (its runner stops at its next step boundary): refused.
    with session_scope(engine) as s:
        run = repo.start_run(s, cascade_id=cascade_id, seed=0, distill=True, output_dir="runs/x")
        run_id = run.id
        repo.set_cascade_status(s, cascade_id=cascade_id, status="aborted", actor="runner")
    status, out = delete(api, cascade_id)
    assert status == 409 and out["current_state"] == "running"
    assert out["detail"].startswith(f"cascade {cascade_id}'s run {run_id} is still running")
    # The run finished, but a live runner still holds the lease: refused, naming it.
    with session_scope(engine) as s:
        repo.finish_run(s, run_id=run_id, status="aborted", actor="runner")
        holder = leases.Holder(token=uuid.uuid4().hex, host="gpu-node-7", pid=4242)
        leases.acquire(s, cascade_id=cascade_id, run_id=run_id, holder=holder, expiry_s=600)
    status, out = delete(api, cascade_id)
    assert status == 409 and "held by a live runner (gpu-node-7 pid 4242" in out["detail"]
    assert rows_of(engine, cascade_id)["runs"] == 1  # refused: nothing deleted
    with session_scope(engine) as s:
        leases.release(s, cascade_id=cascade_id, token=holder.token)
    assert delete(api, cascade_id)[0] == 200


def test_cli_delete(
    api: ApiServer, engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.cli.main import main

    body = create(api, tiny_config("cli-delete", stages=("math",)))
    monkeypatch.setenv("CASCADE_API_URL", api.url)
    monkeypatch.setenv("CASCADE_API_TOKEN", WRITE_TOKEN)
    assert main(["api", "delete", str(body["id"])]) == 1
    assert "HTTP 409" in capsys.readouterr().err
    assert main(["api", "abort", str(body["id"])]) == 0
    capsys.readouterr()
    assert main(["api", "delete", str(body["id"])]) == 0
    assert capsys.readouterr().out == f"cascade {body['id']} deleted (1 stages, 3 events)\n"
    assert rows_of(engine, body["id"])["cascades"] == 0


def test_settings_file_example_with_an_optional_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/control-plane.md's api.yaml: the optional read token's variable unset -> the API starts without
    it (and says so); a required one unset is still an error naming what to do."""
    from services.api.settings import SettingsError, TokenTable, load_settings

    path = tmp_path / "api.yaml"
    path.write_text(
        "database_url: postgresql://postgres@127.0.0.1:5432/cascade\n"
        "tokens:\n"
        "  - {name: alice, role: write, token_env: CASCADE_TOKEN_ALICE}\n"
        "  - {name: grafana, role: read, token_env: CASCADE_TOKEN_GRAFANA, optional: true}\n"
    )
    monkeypatch.setenv("CASCADE_TOKEN_ALICE", "a" * 48)
    monkeypatch.delenv("CASCADE_TOKEN_GRAFANA", raising=False)
    table = TokenTable.from_settings(load_settings(path))
    assert table.describe() == "alice (write); optional, not set: grafana ($CASCADE_TOKEN_GRAFANA unset)"
    assert table.lookup("a" * 48) is not None
    monkeypatch.setenv("CASCADE_TOKEN_GRAFANA", "g" * 48)
    table = TokenTable.from_settings(load_settings(path))
    assert table.describe() == "alice (write), grafana (read)"
    monkeypatch.setenv("CASCADE_TOKEN_GRAFANA", "short")  # set but unusable: still an error
    with pytest.raises(SettingsError, match="tokens.grafana: a token needs at least 16 characters"):
        TokenTable.from_settings(load_settings(path))
    monkeypatch.delenv("CASCADE_TOKEN_ALICE")
    with pytest.raises(
        SettingsError, match="CASCADE_TOKEN_ALICE is not set .* mark the token `optional: true`"
    ):
        TokenTable.from_settings(load_settings(path))


# --------------------------------------------------------------------------- paths confined


def _jsonl(path: str) -> Any:
    def edit(cfg: dict[str, Any]) -> None:
        cfg["domains"][0]["prompts"] = {"kind": "jsonl", "train_path": path, "eval_path": "data/eval.jsonl"}

    return edit


PATH_PROBES: dict[str, tuple[Any, str, str]] = {
    # case: (edit, the field refused, the setting named)
    "model-etc": (lambda c: c.update(model={"path": "/etc"}), "model.path", "paths.model_roots"),
    "model-up": (lambda c: c.update(model={"path": "models/../../../.."}), "model.path", "paths.model_roots"),
    "model-symlink": (lambda c: c.update(model={"path": "models/escape"}), "model.path", "paths.model_roots"),
    "output-etc": (lambda c: c.update(output_dir="/etc"), "output_dir", "paths.runs_root"),
    "output-up": (lambda c: c.update(output_dir="../../.."), "output_dir", "paths.runs_root"),
    "shadow": (_jsonl("/etc/shadow"), "domains.0.prompts.train_path", "paths.data_roots"),
    "data-up": (_jsonl("data/../../../../etc/passwd"), "domains.0.prompts.train_path", "paths.data_roots"),
    "mlflow-store": (
        lambda c: c.update(tracking={"mlflow": {"tracking_uri": "sqlite:////etc/cron.d/mlflow.db"}}),
        "tracking.mlflow.tracking_uri",
        "paths.runs_root",
    ),
    "tensorboard": (
        lambda c: c.update(tracking={"tensorboard": {"log_dir": "runs/../elsewhere"}}),
        "tracking.tensorboard.log_dir",
        "paths.runs_root",
    ),
}


@pytest.mark.parametrize("case", sorted(PATH_PROBES))
def test_paths_outside_the_roots_are_refused(api: ApiServer, base: Path, case: str) -> None:
    (base / "models").mkdir(exist_ok=True)
    if not (base / "models" / "escape").is_symlink():
        (base / "models" / "escape").symlink_to("/etc")  # in the root as written, /etc resolved
    edit, field, setting = PATH_PROBES[case]
    cfg = tiny_config(f"probe-{case}", stages=("math",))
    edit(cfg)
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 422, body
    assert body["field"] == field, body
    assert f"(the API's {setting})" in body["detail"] and " resolves to " in body["detail"], body
    _, listed = api.call("GET", "/api/cascades?limit=1000")
    assert cfg["name"] not in {c["name"] for c in listed}  # nothing stored


@pytest.mark.parametrize("name", ["..", "."])
def test_a_name_that_is_a_directory_is_refused(api: ApiServer, name: str) -> None:
    """The issue's case: name `..` with an output_dir inside another run made the run directory
    (`<output_dir>/<name>`) that run's own; the name is refused whatever output_dir says."""
    cfg = tiny_config(name, stages=("math",))
    cfg["output_dir"] = "runs/other-run/sub"
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 422 and body["field"] == "name", body
    assert "names a directory" in body["detail"]


def test_output_inside_another_run_is_refused(api: ApiServer, base: Path) -> None:
    victim = base / "runs" / "victim"
    victim.mkdir(parents=True, exist_ok=True)
    (victim / "run.json").write_text("{}")
    for output_dir in ("runs/victim", "runs/victim/checkpoints"):
        cfg = tiny_config("nested", stages=("math",))
        cfg["output_dir"] = output_dir
        status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
        assert status == 422 and body["field"] == "output_dir", body
        assert f"inside the run directory {victim}" in body["detail"]
    cfg = tiny_config("tracker-in-victim", stages=("math",))
    cfg["tracking"] = {"tensorboard": {"log_dir": "runs/victim/tensorboard"}}
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 422 and body["field"] == "tracking.tensorboard.log_dir", body


def test_paths_inside_the_roots_are_stored_resolved(api: ApiServer, base: Path) -> None:
    cfg = tiny_config("resolved", stages=("math",))
    cfg["model"] = {"path": "models/../models/./tiny"}
    cfg["output_dir"] = "runs/team-a/../team-b"
    cfg["domains"][0]["prompts"] = {
        "kind": "jsonl",
        "train_path": "data/t.jsonl",
        "eval_path": "data/e.jsonl",
    }
    cfg["tracking"] = {
        "tensorboard": {"log_dir": "runs/team-b/resolved/tb"},  # in its own run directory
        "mlflow": {"tracking_uri": "sqlite:///runs/mlflow.db"},
    }
    body = create(api, cfg)
    _, out = api.call("GET", f"/api/cascades/{body['id']}/config")
    stored = out["config"]
    assert stored["model"]["path"] == str(base / "models" / "tiny")
    assert stored["output_dir"] == str(base / "runs" / "team-b")
    assert stored["domains"][0]["prompts"]["train_path"] == str(base / "data" / "t.jsonl")
    assert stored["tracking"]["tensorboard"]["log_dir"] == str(base / "runs" / "team-b" / "resolved" / "tb")
    assert stored["tracking"]["mlflow"]["tracking_uri"] == f"sqlite:///{base / 'runs' / 'mlflow.db'}"


# --------------------------------------------------------------------------- readiness


def test_health_fails_while_the_database_is_down(tmp_path: Path) -> None:
    """The API on a private Postgres: ready, then 503 while it is stopped (a swallowed error
    used to answer `database: ok`), then ready again once it is back."""
    from private_postgres import PrivatePostgres

    pg = PrivatePostgres()
    try:
        url = pg.database("cascade")
        with running_api(url, tmp_path, name="api-pg") as server:
            assert server.call("GET", "/health")[1]["database"] == "ok"
            pg.stop()
            status, body = server.call("GET", "/health")
            down = {"status": "degraded", "database": "unreachable", "schema_revision": None}
            assert (status, body) == (503, down)
            assert server.call("GET", "/api/cascades")[0] == 503
            pg.start()
            deadline = time.monotonic() + 30
            while server.call("GET", "/health")[0] != 200:
                assert time.monotonic() < deadline, "not ready again after the database came back"
                time.sleep(0.2)
    finally:
        pg.close()


# --------------------------------------------------------------------------- bounded metrics


def series(api: ApiServer) -> list[str]:
    _, text = api.call("GET", "/metrics")
    return sorted(line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("cascade_api_"))


def test_method_names_and_paths_add_no_series(api: ApiServer) -> None:
    """Any token is a valid HTTP method: each used to become a label value, kept for ever
    (11,500 of them: a 2 MB /metrics). 200 random ones, on known and unknown paths: the same
    series, counted under method `other` and route `unmatched`."""
    rng = random.Random(34)

    def word(n: int) -> str:
        return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(n))

    paths = (lambda: "/health", lambda: f"/{word(12).lower()}", lambda: f"/api/cascades/{word(6)}")
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    try:
        for path in paths:  # the first of each kind adds its `other` series
            conn.request("WARMUP", path())
            conn.getresponse().read()
        before = series(api)
        other = counted(api, "other", "/health", 405)
        for i in range(200):
            conn.request(word(8 + i % 5), rng.choice(paths)())
            conn.getresponse().read()
    finally:
        conn.close()
    after = series(api)
    assert after == before
    methods = {m.group(1) for line in after if (m := re.search(r'method="([^"]*)"', line))}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}, methods
    assert counted(api, "other", "/health", 405) > other


# --------------------------------------------------------------------------- secrets


SECRETS = ("hunter2-mlflow-pw", "tok-0f3e9a-secret", "dbpass-77x")


def test_secrets_in_a_config_are_masked_for_readers(api: ApiServer, engine: Engine) -> None:
    cfg = tiny_config("with-secrets", stages=("math",))
    cfg["tracking"] = {
        "mlflow": {
            "tracking_uri": f"https://bob:{SECRETS[0]}@mlflow.example.com:5000",
            "tags": {"api_token": SECRETS[1], "team": "rl"},
        }
    }
    cfg["chat"] = {"system_prompt": f"results go to postgresql://svc:{SECRETS[2]}@db/results"}
    status, created = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 201, created
    cascade_id = created["id"]
    answers = {
        "create": created,
        "detail": api.call("GET", f"/api/cascades/{cascade_id}")[1],
        "config": api.call("GET", f"/api/cascades/{cascade_id}/config")[1],  # the dashboard's Config
        "events": api.call("GET", f"/api/cascades/{cascade_id}/events")[1],
    }
    for where, answer in answers.items():
        text = json.dumps(answer)
        assert not [s for s in SECRETS if s in text], (where, text)
    mlflow = answers["config"]["config"]["tracking"]["mlflow"]
    assert mlflow["tracking_uri"] == "https://bob:***@mlflow.example.com:5000"
    assert mlflow["tags"] == {"api_token": "***", "team": "rl"}
    assert answers["detail"]["config"] == answers["config"]["config"]
    # The database keeps them: the runner reads the config from there.
    with session_scope(engine) as s:
        row = s.get(Cascade, cascade_id)
        assert row is not None
        stored = json.dumps(row.config)
    assert all(secret in stored for secret in SECRETS)
    # The dashboard shows the config it fetches from /config (above) and no other copy of it.
    script = (REPO / "services" / "api" / "static" / "dashboard.js").read_text()
    assert "/config`" in script and "tracking" not in script


# --------------------------------------------------------------------------- slow bodies


def _exchange(port: int, head: bytes, first: bytes, trickle_s: float | None = None) -> tuple[bytes, float]:
    """Send `head` and `first`, then stall (or send one more byte every `trickle_s`) and read
    until the server closes the connection: (what it answered, seconds until it closed)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=BODY_TIMEOUT_S + 15)
    start = time.monotonic()
    try:
        sock.sendall(head + first)
        while trickle_s is not None:
            assert time.monotonic() - start < BODY_TIMEOUT_S + 15, "no answer to a trickling body"
            sock.settimeout(trickle_s)
            try:
                sock.recv(1, socket.MSG_PEEK)  # an answer (or the close) has begun
                break
            except TimeoutError:
                sock.sendall(b" ")
        sock.settimeout(BODY_TIMEOUT_S + 15)
        data = b""
        while chunk := sock.recv(65536):  # a server that never closes: socket.timeout, a failure
            data += chunk
        return data, time.monotonic() - start
    finally:
        sock.close()


@pytest.mark.parametrize("trickle_s", [None, 0.3], ids=["stalls", "trickles"])
def test_a_slow_body_is_cut_at_the_bound(api: ApiServer, trickle_s: float | None) -> None:
    before = counted(api, "POST", "/api/cascades", 408)
    head = (
        "POST /api/cascades HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {WRITE_TOKEN}\r\nContent-Length: 5000\r\n\r\n"
    ).encode()
    answer, took = _exchange(api.port, head, b'{"name": "slow", ', trickle_s)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"limits.body_timeout_s" in answer and b"connection: close" in answer.lower()
    assert BODY_TIMEOUT_S - 0.5 < took < BODY_TIMEOUT_S + 5, took
    assert counted(api, "POST", "/api/cascades", 408) == before + 1


def test_an_unread_body_does_not_hold_the_connection(api: ApiServer) -> None:
    """A route that reads no body answers at once, and closes the connection rather than wait
    for a declared body that never comes."""
    head = b"GET /health HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n"
    answer, took = _exchange(api.port, head, b"x" * 10)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" in answer.lower(), answer[:300]
    assert took < BODY_TIMEOUT_S + 5


# --------------------------------------------------------------------------- headers


def headers_of(api: ApiServer, method: str, path: str) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(api.url + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}


@pytest.mark.parametrize(
    "method,path",
    [("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json"), ("GET", "/health"),
     ("GET", "/api/cascades"), ("GET", "/metrics"), ("GET", "/static/dashboard.js"),
     ("GET", "/docs/assets/swagger-ui.css"), ("GET", "/nowhere"), ("POST", "/api/cascades"),
     ("BREW", "/health"), ("GET", "/")],
)  # fmt: skip
def test_every_answer_refuses_sniffing_and_framing(api: ApiServer, method: str, path: str) -> None:
    status, headers = headers_of(api, method, path)
    assert status in (200, 401, 404, 405), status
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    if headers.get("content-type", "").startswith("application/json"):
        assert headers["content-security-policy"].startswith("default-src 'none'")
    if path == "/":  # the dashboard keeps its own, stricter policy
        assert "script-src 'self'" in headers["content-security-policy"]

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
- `GET /api/cascades/{id}/config`: the stored config and its hash.
"""

from __future__ import annotations

import http.client
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_procs import READ_TOKEN, WRITE_TOKEN, ApiServer, fresh_schema, running_api, tiny_config
from api_seed import seed
from sqlalchemy import Engine, func, select

from cascade.store import leases, repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Cascade, Checkpoint, Eval, Event, Run, RunLease, Stage, Step

pytestmark = pytest.mark.postgres
MAX_BODY = 100_000
MAX_STAGES = 6
DEEP = 1000


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    limits = {"limits": {"max_body_bytes": MAX_BODY, "max_stages_per_cascade": MAX_STAGES}}
    with running_api(db_url, tmp_path_factory.mktemp("api"), extra=limits) as server:
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

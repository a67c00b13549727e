"""The API application in-process (plain ASGI calls, no server): an unexpected error is answered
as a 500 with a generic body and counted in `cascade_api_requests_total` like every answer, and
the settings' `limits` reach the handlers; `/health` fails with its database, metric labels stay
in bounded sets, a stalled body is a 408; secrets are masked; path settings and their
environment variables."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from services.api.app import create_app
from services.api.settings import ApiLimits, ApiSettings, TokenTable

TOKEN = "unit-test-token-0123456789"


def _app(limits: ApiLimits | None = None) -> Any:
    settings = ApiSettings.model_validate({"tokens": [{"name": "t", "role": "write", "token": TOKEN}]})
    app = create_app(create_engine("sqlite://"), TokenTable.from_settings(settings), limits)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/deep")
    def deep() -> None:
        raise RecursionError("maximum recursion depth exceeded")

    return app


def call(
    app: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    messages: list[dict[str, Any]] = []
    chunks = [body]

    async def receive() -> dict[str, Any]:
        if chunks:
            return {"type": "http.request", "body": chunks.pop(), "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
        "raw_path": path.encode(), "query_string": b"", "headers": raw, "scheme": "http",
        "server": ("test", 80), "client": ("test", 1234), "root_path": "",
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


def metric(app: Any, labels: str) -> float:
    _, text = call(app, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(f"cascade_api_requests_total{{{labels}}} "):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("path", ["/boom", "/deep"])
def test_unexpected_errors_are_500_and_counted(path: str, caplog: pytest.LogCaptureFixture) -> None:
    app = _app()
    for _ in range(2):
        status, body = call(app, "GET", path)
        assert (status, json.loads(body)) == (500, {"detail": "internal server error"})
    assert metric(app, f'method="GET",route="{path}",status="500"') == 2
    assert f"unhandled error on GET {path}" in caplog.text  # logged with its traceback, once each


def test_limits_from_the_settings_reach_the_handlers() -> None:
    app = _app(ApiLimits(max_body_bytes=2048, max_config_depth=8, max_stages_per_cascade=2))
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, body = call(app, "POST", "/api/cascades", b" " * 2049, {**auth, "Content-Length": "2049"})
    assert status == 413 and b"2048 bytes" in body
    status, body = call(app, "POST", "/api/cascades", b"[" * 9 + b"]" * 9, auth)
    assert status == 422 and b"nested deeper than 8 levels" in body
    cfg = {"name": "x", "model": {"path": "m"}, "domains": [{"name": "math"}],
           "stages": [{"name": f"s{i}", "domain": "math"} for i in range(3)]}  # fmt: skip
    status, body = call(app, "POST", "/api/cascades", json.dumps(cfg).encode(), auth)
    assert status == 422 and json.loads(body)["field"] == "stages"
    assert metric(app, 'method="POST",route="/api/cascades",status="422"') == 2


def test_limits_are_bounded_settings() -> None:
    from pydantic import ValidationError

    assert ApiSettings().limits == ApiLimits(
        max_body_bytes=1_000_000, max_config_depth=64, max_stages_per_cascade=64
    )
    with pytest.raises(ValidationError):
        ApiLimits(max_config_depth=500)  # past what the parsers' own recursion allows


# --------------------------------------------------------------------------- readiness, labels


def test_health_is_503_when_the_database_is_down() -> None:
    """An engine on a closed port: the schema revision's fallback used to swallow the error and
    answer `database: ok`."""
    from api_procs import free_port

    from cascade.store.db import make_engine

    engine = make_engine(
        f"postgresql://nobody@127.0.0.1:{free_port()}/none", connect_args={"connect_timeout": 2}
    )
    settings = ApiSettings.model_validate({"tokens": [{"name": "t", "role": "write", "token": TOKEN}]})
    app = create_app(engine, TokenTable.from_settings(settings))
    status, body = call(app, "GET", "/health")
    assert (status, json.loads(body)) == (
        503,
        {"status": "degraded", "database": "unreachable", "schema_revision": None},
    )


def test_labels_come_from_bounded_sets() -> None:
    app = _app()
    for i in range(20):
        call(app, f"M{i}", "/health")
        call(app, "GET", f"/no/such/path/{i}")
    assert metric(app, 'method="other",route="/health",status="405"') == 20
    assert metric(app, 'method="GET",route="unmatched",status="404"') == 20
    text = call(app, "GET", "/metrics")[1].decode()
    assert not any(f'"M{i}"' in text or f"/no/such/path/{i}" in text for i in range(20))


def test_a_stalled_body_is_408_within_the_bound() -> None:
    """In-process: headers and part of a body, then nothing (tests/integration/test_api_hardening.py
    does it over a socket to a real server)."""
    import time

    app = _app(ApiLimits(body_timeout_s=0.5))
    sent: list[dict[str, Any]] = []
    parts = [b'{"name": ']

    async def receive() -> dict[str, Any]:
        if parts:
            return {"type": "http.request", "body": parts.pop(), "more_body": True}
        await asyncio.sleep(60)  # the client stalls
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"content-length", b"500")]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "path": "/api/cascades", "raw_path": b"/api/cascades", "query_string": b"", "headers": headers,
        "scheme": "http", "server": ("test", 80), "client": ("test", 1234), "root_path": "",
    }  # fmt: skip
    start = time.monotonic()
    asyncio.run(app(scope, receive, send))
    assert time.monotonic() - start < 5
    head = next(m for m in sent if m["type"] == "http.response.start")
    assert head["status"] == 408 and (b"connection", b"close") in head["headers"]
    assert metric(app, 'method="POST",route="/api/cascades",status="408"') == 1


# --------------------------------------------------------------------------- secrets, settings


def test_redaction() -> None:
    from services.api.redact import redact, secret_key

    secret = ["password", "db_password", "token", "hf_token", "apiKey", "WANDB_API_KEY", "client_secret",
              "secret_key", "access-key", "credentials"]  # fmt: skip
    plain = ["max_new_tokens", "micro_batch_tokens", "pass_threshold", "tracking_uri", "author", "keep_last"]
    assert [k for k in secret if not secret_key(k)] == [] and [k for k in plain if secret_key(k)] == []
    tags = {"api_token": "t0k", "team": "rl", "password": 123456, "secret": None}
    uri = "postgresql://u:p@ss@db:5432/m?sslmode=require&password=x"
    urls = ["redis://:pw@h:6379/0", "https://h/x?sig=1&token=abc", "postgresql://cascade@db/x"]
    config = {"tracking": {"mlflow": {"tracking_uri": uri, "tags": tags}}, "budget": {"max_new_tokens": 32}}
    assert redact({**config, "urls": urls}) == {
        "tracking": {
            "mlflow": {
                "tracking_uri": "postgresql://u:***@db:5432/m?sslmode=require&password=***",
                "tags": {"api_token": "***", "team": "rl", "password": "***", "secret": None},
            }
        },
        "budget": {"max_new_tokens": 32},
        "urls": ["redis://:***@h:6379/0", "https://h/x?sig=1&token=***", "postgresql://cascade@db/x"],
    }
    assert urls[0] == "redis://:pw@h:6379/0" and tags["api_token"] == "t0k"  # the input is untouched


def test_path_settings_from_the_file_and_the_environment(tmp_path: Any) -> None:
    from services.api.paths import PathRoots
    from services.api.settings import SettingsError, with_environment

    settings = ApiSettings.model_validate({"paths": {"runs_root": "/srv/runs", "model_roots": ["m"]}})
    roots = PathRoots.from_settings(settings.paths, cwd=tmp_path)
    assert (roots.base, roots.runs, roots.models, roots.data) == (
        tmp_path, Path("/srv/runs"), (tmp_path / "m",), (tmp_path / "data",)
    )  # fmt: skip
    env = {"CASCADE_API_RUNS_ROOT": "/ckpt/runs", "CASCADE_API_MODEL_ROOTS": "/models:/ckpt",
           "CASCADE_API_DATA_ROOTS": "", "CASCADE_API_BODY_TIMEOUT_S": "7.5"}  # fmt: skip
    over = with_environment(settings, env)
    assert over.paths.runs_root == Path("/ckpt/runs") and over.paths.model_roots == [
        Path("/models"),
        Path("/ckpt"),
    ]
    assert over.paths.data_roots == [Path("data")] and over.limits.body_timeout_s == 7.5  # empty: ignored
    assert over.tokens == settings.tokens
    with pytest.raises(SettingsError, match="^CASCADE_API_BODY_TIMEOUT_S: body_timeout_s: "):
        with_environment(settings, {"CASCADE_API_BODY_TIMEOUT_S": "-1"})

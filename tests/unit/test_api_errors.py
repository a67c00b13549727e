"""The API application in-process (plain ASGI calls, no server): an unexpected error is answered
as a 500 with a generic body and counted in `cascade_api_requests_total` like every answer, and
the settings' `limits` reach the handlers."""

from __future__ import annotations

import asyncio
import json
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

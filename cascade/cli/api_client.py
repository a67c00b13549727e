"""A small client for the control plane's REST API (what `cascade api` and `cascade stage` call).

Standard library only (urllib), so the CLI stays light. Errors come back as `ApiError` with the
HTTP status and the server's one-line `detail` (e.g. a 409 naming the stage's current state).
The token is sent as a bearer header and never printed.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "CASCADE_API_URL"
TOKEN_ENV = "CASCADE_API_TOKEN"


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail


class ApiClient:
    def __init__(
        self, base_url: str | None = None, token: str | None = None, timeout_s: float = 30.0
    ) -> None:
        self.base_url = (base_url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        self._token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.timeout_s = timeout_s

    def request(
        self, method: str, path: str, *, body: bytes | None = None, content_type: str = "application/json"
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(self.base_url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - operator's URL
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, _detail(err.read())) from None
        except urllib.error.URLError as err:
            raise ApiError(0, f"cannot reach the control plane at {self.base_url}: {err.reason}") from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, payload: Any = None) -> Any:
        return self.request("POST", path, body=json.dumps(payload if payload is not None else {}).encode())

    def create_cascade_yaml(self, text: str) -> Any:
        return self.request("POST", "/api/cascades", body=text.encode(), content_type="application/yaml")

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def stage_command(self, stage_id: int, command: str) -> Any:
        return self.post(f"/api/stages/{stage_id}/{command}")

    def stage_command_in(self, cascade_id: int, stage: str, command: str) -> Any:
        """The command on the cascade's stage named `stage` (or at that 0-based index)."""
        ref = urllib.parse.quote(stage, safe="")
        return self.post(f"/api/cascades/{cascade_id}/stages/{ref}/{command}")


def _detail(raw: bytes) -> str:
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()[:300] or "no detail"
    detail = data.get("detail") if isinstance(data, dict) else data
    if isinstance(detail, str):
        return detail
    return json.dumps(detail)[:300]

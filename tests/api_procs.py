"""The control plane as a real subprocess on a free port, over its own fresh Postgres schema.

`python -m services.api.main` is started in its own session (its pid is its process group) and
stopped by that pid, never by name. Its settings file holds one write and one read token, and
path roots (`paths`) that admit what the tests create cascades with: every root is the system's
temporary directory (where pytest's tmp_path lives), and relative paths in a config are taken
from the server's own log directory (so `tiny_config`'s `models/tiny` and the default `runs`
land in it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pg_schema
import yaml

REPO = Path(__file__).resolve().parents[1]
TEMP_ROOT = str(Path(tempfile.gettempdir()).resolve())
WRITE_TOKEN = "write-" + uuid.uuid4().hex  # random per session: the log test greps for them
READ_TOKEN = "read-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_schema() -> AbstractContextManager[str]:
    """A Postgres URL whose search_path is a new, empty schema (dropped afterwards)."""
    return pg_schema.fresh_schema("api")


class ApiServer:
    def __init__(
        self, db_url: str, log_dir: Path, *, name: str = "api", extra: dict[str, Any] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_url = db_url
        self.base_dir = log_dir.resolve()
        """What the server resolves a config's relative paths from."""
        paths = {"base_dir": str(self.base_dir), "runs_root": TEMP_ROOT}
        paths |= {"model_roots": [TEMP_ROOT], "data_roots": [TEMP_ROOT]}
        settings = {
            "tokens": [
                {"name": "alice", "role": "write", "token_env": "TEST_API_WRITE_TOKEN"},
                {"name": "viewer", "role": "read", "token": READ_TOKEN},
            ],
            "db_wait_s": 10,
            "paths": paths,
            **(extra or {}),
        }
        config = log_dir / f"{name}-settings.yaml"
        config.write_text(yaml.safe_dump(settings))
        self.log_path = log_dir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_API_")}
        env.update({"TEST_API_WRITE_TOKEN": WRITE_TOKEN, "PYTHONUNBUFFERED": "1"})
        argv = [sys.executable, "-m", "services.api.main", "--port", str(self.port)]
        argv += ["--db", db_url, "--config", str(config), "--log-level", "INFO"]
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"api exited ({self.popen.returncode}):\n{self.log()[-3000:]}")
            try:
                status, _ = self.call("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"api not ready within {timeout_s}s:\n{self.log()[-3000:]}")
            time.sleep(0.2)

    def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        json_body: Any = None,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if json_body is not None:
            body = json.dumps(json_body).encode()
        if body is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._signal(signal.SIGKILL)
        if self.popen.poll() is None:
            self.popen.wait(timeout=10)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass


@contextmanager
def running_api(
    db_url: str, log_dir: Path, name: str = "api", extra: dict[str, Any] | None = None
) -> Iterator[ApiServer]:
    """The server on `db_url`; `extra` settings (e.g. `limits`) merged into its settings file."""
    server = ApiServer(db_url, log_dir, name=name, extra=extra)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def tiny_config(name: str = "t", stages: tuple[str, ...] = ("math", "code", "if")) -> dict[str, Any]:
    """A valid cascade config (never run: the model path need not exist)."""
    domains = list(dict.fromkeys(stages))
    return {
        "name": name,
        "model": {"path": "models/tiny"},
        "domains": [{"name": d} for d in domains],
        "stages": [{"domain": d, "advance": {"max_steps": 10}} for d in stages],
    }

"""A PostgreSQL server of the test's own (initdb + pg_ctl in a temp dir, on a free port), so a
test can stop and restart it for real without touching the shared server other tests use.

The server binaries refuse to run as root: as root they run as the `postgres` user (`runuser`),
over a directory it owns. Skips when the binaries are missing, unless
CASCADE_REQUIRE_POSTGRES=1 (then it fails).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    def __init__(self) -> None:
        if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
            reason = "initdb/pg_ctl not on PATH: no private PostgreSQL"
            if os.environ.get("CASCADE_REQUIRE_POSTGRES") == "1":
                pytest.fail(reason)
            pytest.skip(reason)
        self.as_root = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="cascade-pg-"))
        self.dir.chmod(0o755)
        if self.as_root:
            shutil.chown(self.dir, "postgres")
        self.data = self.dir / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "-N")
        self.start()

    def database(self, name: str) -> str:
        """A new, empty database on this server; its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def _pg(self, *argv: str) -> None:
        cmd = (["runuser", "-u", "postgres", "--"] if self.as_root else []) + list(argv)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr.strip()}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.dir / "server.log")
        self._pg("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float = 2.5) -> None:
        """Stop (fast: every connection is cut), stay down `down_s`, start again."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # already stopped
        shutil.rmtree(self.dir, ignore_errors=True)

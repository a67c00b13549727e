"""A runner frozen, or cut off from Postgres, past its lease, and taken over: the new holder
completes the cascade and the stale one stops without writing anything (issue 34).

Before fencing, the stale runner's step write blocked on the database landed after it had been
taken over: the *new, rightful* runner then died on `ConflictingRow`, the cascade stalled and
`samples.jsonl` held a step's sample ids twice. Both runners here are real `cascade run`
processes on the same run directory and database:

- frozen: SIGSTOP (a stopped process is no live holder: the taker on this host may take over
  once its lease expired by the database's clock), SIGCONT once the taker trains;
- partitioned: the stale runner reaches Postgres through a TCP proxy that stops forwarding, and
  runs in its own PID namespace (as a runner on another host: its live pid is nothing this host
  can see), the partition healed once the taker trains.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from cascade.store import leases
from cascade.store.db import make_engine, session_scope
from cascade.store.models import RunLease

pytestmark = pytest.mark.postgres

STAGE_STEPS = 4
STEPS = 2 * STAGE_STEPS


def _config(e2e: Any, directory: Path) -> Path:
    def edit(data: dict[str, Any]) -> None:
        for stage in data["stages"]:
            stage["advance"]["max_steps"] = STAGE_STEPS
        data["lease"] = {"heartbeat_s": 1, "expiry_s": 4}
        data["checkpoint"] = {"every": 1, "keep_last": 2}

    e2e.config(directory, edit)
    return directory / "cascade.yaml"


def _cascade_run(*argv: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    cascade = Path(sys.executable).parent / "cascade"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(
        [*prefix, str(cascade), "run", *argv, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _samples(run_dir: Path) -> list[dict[str, Any]]:
    log = run_dir / "samples.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _wait(what: str, check: Any, proc: subprocess.Popen[str], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            out = proc.communicate()
            raise AssertionError(f"cascade run exited ({proc.returncode}) before {what}: {out}")
        assert time.monotonic() < deadline, f"no {what} within {timeout_s}s"
        time.sleep(0.1)


def _lease_expired(url: str) -> bool:
    engine = make_engine(url)
    try:
        with session_scope(engine) as s:
            lease = s.scalars(select(RunLease)).one_or_none()
            return lease is not None and not leases.is_live(lease, leases.db_now(s))
    finally:
        engine.dispose()


def _stale_and_new(e2e: Any, url: str, run_dir: Path, stale: subprocess.Popen[str], wake: Any) -> None:
    """Take `stale`'s lease over once it expired, wake `stale` once the taker trains, and check
    what each did."""
    cfg = run_dir.parent / "cascade.yaml"
    _wait("the stale runner's lease to expire", lambda: _lease_expired(url), stale, 120)
    taker = _cascade_run(str(cfg), "--run-dir", str(run_dir), "--db", url, "--resume")
    try:
        done_before = len(_samples(run_dir))
        _wait("a step of the taker", lambda: len(_samples(run_dir)) > done_before, taker)
        wake()
        out, err = stale.communicate(timeout=300)
        assert stale.returncode == 1, (out, err)
        assert "another runner took this cascade over" in err, err
        assert "Traceback" not in err and "ConflictingRow" not in err, err
        t_out, t_err = taker.communicate(timeout=900)
    finally:
        for proc in (stale, taker):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert taker.returncode == 0, (t_out, t_err)
    rows = e2e.rows(url)
    assert rows.run_status == "completed"
    assert [g for _, _, g, _ in rows.steps] == list(range(1, STEPS + 1))
    trained = _samples(run_dir)
    assert [t["global_step"] for t in trained] == list(range(1, STEPS + 1)), "a step logged twice"
    ids = [sid for t in trained for sid in t["sample_ids"]]
    assert len(ids) == len(set(ids)), "a sample was trained twice"
    assert not list((run_dir / "checkpoints").glob("*.staged")) or "removed" in t_out + t_err


def test_a_frozen_runner_is_taken_over_and_stops_without_writing(
    e2e: Any, postgres_url: str, tmp_path: Path
) -> None:
    cfg = _config(e2e, tmp_path)
    run_dir = tmp_path / "run"
    stale = _cascade_run(str(cfg), "--run-dir", str(run_dir), "--db", postgres_url)
    _wait("step 3", lambda: len(_samples(run_dir)) >= 3, stale)
    stale.send_signal(signal.SIGSTOP)
    try:
        _stale_and_new(e2e, postgres_url, run_dir, stale, lambda: stale.send_signal(signal.SIGCONT))
    finally:
        if stale.poll() is None:
            stale.send_signal(signal.SIGCONT)


class Partition:
    """A TCP proxy to Postgres that can stop forwarding (both ways, connections kept open: a
    partition, not a refusal) and heal."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                self.flowing.wait()
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.flowing.set()
        self.listener.close()


@pytest.fixture
def partition(postgres_url: str) -> Iterator[Partition]:
    url = make_url(postgres_url)
    proxy = Partition((url.host or "127.0.0.1", url.port or 5432))
    yield proxy
    proxy.close()


def _own_pid_namespace() -> tuple[str, ...]:
    unshare = shutil.which("unshare")
    prefix = (unshare, "--pid", "--fork", "--mount-proc") if unshare else ()
    if not prefix or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot start a process in its own PID namespace here (unshare --pid needs root)")
    return prefix  # type: ignore[return-value]


def test_a_partitioned_runner_is_taken_over_and_stops_without_writing(
    e2e: Any, postgres_url: str, partition: Partition, tmp_path: Path
) -> None:
    prefix = _own_pid_namespace()
    cfg = _config(e2e, tmp_path)
    run_dir = tmp_path / "run"
    through_proxy = make_url(postgres_url).set(port=partition.port).render_as_string(hide_password=False)
    stale = _cascade_run(str(cfg), "--run-dir", str(run_dir), "--db", through_proxy, prefix=prefix)
    _wait("step 3", lambda: len(_samples(run_dir)) >= 3, stale)
    partition.flowing.clear()
    _stale_and_new(e2e, postgres_url, run_dir, stale, partition.flowing.set)

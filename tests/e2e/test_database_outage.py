"""The embedded run rides out its database: a PRIVATE Postgres (tests/private_postgres.py) is
restarted for real during a cascade on the tiny model, at a random step.

- Down ~2.5 s: the run completes, steps contiguous, no step row twice, no sample trained twice
  (the samples log), and the outage is in the step metrics, the events and the log (once each way).
- Down past `resilience.database_s`: `cascade run` stops with one line naming the cause and the
  exact resume command (no traceback), and that command, once Postgres is back, completes the run.

The distributed learner runs this same loop and store (`services.learner.learner` builds a
`CascadeRunner`, whose `RunStore` is the one retried here), so its database writes ride out an
outage the same way; its Prometheus metrics watch the same `Dependency`.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from private_postgres import PrivatePostgres

from cascade.runner.embedded import embedded_runner
from cascade.store.db import make_engine, session_scope
from services.api import queries

pytestmark = pytest.mark.postgres

STAGE_STEPS = 5
STEPS = 2 * STAGE_STEPS


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    yield server
    server.close()


def _config(e2e: Any, directory: Path, database_s: float) -> Any:
    def edit(data: dict[str, Any]) -> None:
        for stage in data["stages"]:
            stage["advance"]["max_steps"] = STAGE_STEPS
        data["lease"] = {"heartbeat_s": 1, "expiry_s": 3}
        data["resilience"] = {"database_s": database_s}

    return e2e.config(directory, edit)


def _check_trained_once(e2e: Any, url: str, run_dir: Path) -> list[dict[str, Any]]:
    """Steps 1..STEPS once each, in the store and the samples log, no sample id twice; the step
    metrics."""
    rows = e2e.rows(url)
    assert rows.run_status == "completed"
    assert [g for _, _, g, _ in rows.steps] == list(range(1, STEPS + 1))
    assert len({(stage, step) for stage, step, _, _ in rows.steps}) == STEPS
    trained = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [t["global_step"] for t in trained] == list(range(1, STEPS + 1))
    ids = [sid for t in trained for sid in t["sample_ids"]]
    assert ids and len(ids) == len(set(ids)), "a sample was trained twice"
    return [metrics for _, _, _, metrics in rows.steps]


def test_a_postgres_restart_at_a_random_step_is_ridden_out(
    e2e: Any, pg: PrivatePostgres, tmp_path: Path
) -> None:
    url = pg.database("restart")
    cfg = _config(e2e, tmp_path, database_s=120)
    at = random.Random().randint(2, STEPS - 3)
    print(f"Postgres restarted after global step {at}")
    lines: list[str] = []
    noticed = threading.Event()
    trigger = threading.Event()
    down: dict[str, float] = {}

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("database unreachable"):
            noticed.set()

    def on_step(global_step: int, metrics: dict[str, Any]) -> None:
        if global_step == at:
            trigger.set()

    def restart() -> None:
        trigger.wait(timeout=600)
        t0 = time.monotonic()
        pg.stop()
        noticed.wait(timeout=120)  # the runner found it down (it calls the store every step)
        time.sleep(max(0.0, 2.5 - (time.monotonic() - t0)))
        pg.start()
        down["s"] = time.monotonic() - t0

    fault = threading.Thread(target=restart, daemon=True)
    fault.start()
    runner = embedded_runner(cfg, run_dir=tmp_path / "run", db_url=url, log=log, on_step=on_step)
    result = runner.run()
    fault.join(timeout=60)
    assert result.stopped_by == "completed", lines[-5:]
    assert noticed.is_set() and down["s"] >= 2.5

    metrics = _check_trained_once(e2e, url, tmp_path / "run")
    assert max(m["resilience/database_outages"] for m in metrics) == 1
    assert max(m["resilience/database_down_s"] for m in metrics) >= 1.0
    assert [line for line in lines if line.startswith("database ")] == [
        next(line for line in lines if line.startswith("database unreachable")),
        next(line for line in lines if line.startswith("database back after")),
    ]
    outages = [kind for kind, *_ in e2e.rows(url).events if kind == "outage"]
    assert outages == ["outage"]
    engine = make_engine(url)  # what the API shows of the run
    try:
        with session_scope(engine) as s:
            shown = queries.cascade_detail(s, queries.list_cascades(s, limit=1, offset=0)[0].id).runs[0]
    finally:
        engine.dispose()
    print(f"the API shows: {shown.outages['database']}; Postgres was down {down['s']:.1f}s")
    assert shown.outages["database"].outages == 1 and shown.outages["database"].down_s >= 1.0
    assert shown.degraded == {}


def _cascade_run(*argv: str) -> subprocess.Popen[str]:
    cascade = Path(sys.executable).parent / "cascade"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(
        [str(cascade), "run", *argv, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_for_steps(run_dir: Path, n: int, proc: subprocess.Popen[str], timeout_s: float = 600) -> None:
    log = run_dir / "samples.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"cascade run exited early ({proc.returncode}): {proc.communicate()}")
        time.sleep(0.1)
    raise AssertionError(f"no step {n} within {timeout_s}s")


def test_postgres_down_past_the_bound_stops_with_the_resume_command(
    e2e: Any, pg: PrivatePostgres, tmp_path: Path
) -> None:
    url = pg.database("bound")
    cfg = _config(e2e, tmp_path, database_s=3)
    run_dir = tmp_path / "run"
    # After the first complete checkpoint (every 2 steps, written after step 2's samples line):
    # a stop before it cannot be resumed, and the hint printed then is wrong (docs/operations.md,
    # Limits).
    at = random.Random().randint(3, STEPS - 3)
    print(f"Postgres stopped after global step {at}")
    proc = _cascade_run(str(tmp_path / "cascade.yaml"), "--run-dir", str(run_dir), "--db", url)
    try:
        _wait_for_steps(run_dir, at, proc)
        pg.stop()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        pg.start()
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert "database unreachable for 3s (bound reached)" in err, err
    print(err.strip().splitlines()[-2:])
    prefix = "continue with (once that is fixed): "
    hint = next(line for line in err.splitlines() if line.startswith(prefix))[len(prefix) :]
    words = shlex.split(hint)
    assert words[:3] == ["cascade", "run", str(tmp_path / "cascade.yaml")]
    assert "--resume" in words and words[words.index("--db") + 1] == url
    assert cfg.resilience.database_s == 3

    again = _cascade_run(*words[2:])
    out, err = again.communicate(timeout=900)
    assert again.returncode == 0, (out, err)
    _check_trained_once(e2e, url, run_dir)

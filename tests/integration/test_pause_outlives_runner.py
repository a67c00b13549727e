"""An operator's pause is state, not a message to one process (issue 21, item 4).

A real runner (`cascade run --db postgresql://... --cascade-id N --follow`, a subprocess on the
random tiny model) applies a pause and is killed with SIGKILL while paused, as a node failure or
a supervisor's restart would: the API shows its run `stalled` with the stage still paused; a
`--resume` without `--follow` stops at once, paused, training nothing; a `--resume --follow`
runner takes the lease and waits, paused, until the operator resumes the stage, then trains to
the end with contiguous steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from cascade.config import CascadeConfig
from cascade.runner.embedded import embedded_runner
from cascade.runner.run_store import RunStore
from cascade.store import control, db, repo
from cascade.store.models import Step
from services.api import queries

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(torch_one_thread: None) -> Iterator[None]:
    yield


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 120, proc: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"runner exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s}s")
        time.sleep(0.1)


def test_a_pause_survives_a_killed_runner_and_a_resume(
    random_tiny_model: Path, tmp_path: Path, postgres_url: str
) -> None:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 32, "n_eval": 8}
    grpo = {"group_size": 4, "prompts_per_step": 4, "budget": {"max_new_tokens": 8}}
    data = {
        "name": "paused",
        "model": {"path": str(random_tiny_model)},
        "domains": [{"name": "math", "prompts": prompts}],
        "stages": [{"domain": "math", "grpo": grpo, "advance": {"max_steps": 6}, "eval": {"every": 1000}}],
        "checkpoint": {"every": 1000, "keep_last": 2},
        "lease": {"heartbeat_s": 0.5, "expiry_s": 3},
        "output_dir": str(tmp_path / "runs"),
    }
    cfg = CascadeConfig.model_validate(data)
    cfg_path = tmp_path / "cascade.yaml"
    cfg_path.write_text(yaml.safe_dump(data, sort_keys=False))
    store = RunStore(postgres_url)
    with db.session_scope(store.engine) as s:
        cascade_id = repo.create_cascade(s, name="paused", config=cfg.model_dump(mode="json")).id
        [stage_id] = [st.id for st in repo.create_stages(s, cascade_id=cascade_id, stages=[("math", "math")])]
        control.start_stage(s, stage_id=stage_id, actor="op")
    run_dir = tmp_path / "runs" / "paused"

    def shown() -> Any:
        with db.session_scope(store.engine) as s:
            return queries.cascade_detail(s, cascade_id)

    def steps() -> list[int]:
        with db.session_scope(store.engine) as s:
            return list(s.scalars(select(Step.global_step).order_by(Step.global_step)))

    def operator(command: str) -> None:
        with db.session_scope(store.engine) as s:
            control.stage_command(s, stage_id=stage_id, command=command, actor="op")

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "cascade.cli", "run", str(cfg_path), "--no-progress"]
    log = (tmp_path / "runner.log").open("ab")
    runner = subprocess.Popen(
        [*argv, "--db", postgres_url, "--cascade-id", str(cascade_id), "--follow"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for("2 steps", lambda: shown().stages[0].steps_done >= 2, proc=runner)
        operator("pause")
        wait_for("the pause", lambda: shown().stages[0].state == "paused", proc=runner)
        paused_at = steps()
        os.killpg(runner.pid, signal.SIGKILL)  # the node dies with the paused runner on it
        runner.wait(timeout=10)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=10)
        log.close()
    stalled = wait_for("stalled", lambda: (d := shown()).runs[0].status == "stalled" and d, timeout_s=10)
    assert (stalled.stages[0].state, stalled.stages[0].desired_state) == ("paused", None)  # the intent kept

    # a supervisor restarts it: `--resume` alone stops at once, paused, and trains nothing
    done = subprocess.run(
        [*argv, "--resume", "--run-dir", str(run_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "run paused; continue with" in done.stderr and "cascade stage resume" in done.stderr
    assert shown().stages[0].state == "paused" and steps() == paused_at

    # `--resume --follow` takes the lease and waits, paused, until the operator resumes the stage
    results: list[Any] = []
    lines: list[str] = []

    def resume() -> None:
        results.append(
            embedded_runner(
                cfg,
                run_dir=run_dir,
                db_url=postgres_url,
                cascade_id=cascade_id,
                resume=True,
                follow=True,
                poll_s=0.2,
                log=lines.append,
            ).run()
        )

    thread = threading.Thread(target=resume)
    thread.start()
    try:
        wait_for("the waiting runner", lambda: (d := shown()).runs[0].holder is not None and d, timeout_s=120)
        time.sleep(1.5)
        detail = shown()
        assert detail.runs[0].status == "running" and detail.stages[0].state == "paused"
        assert steps() == paused_at
        operator("resume")
    finally:
        thread.join(timeout=180)
    assert results and results[0].stopped_by == "completed", lines[-5:]
    assert any("stays paused until it is resumed" in line for line in lines)
    detail = shown()
    assert detail.status == "completed" and detail.stages[0].steps_done == 6
    assert steps() == list(range(1, 7))  # contiguous: nothing trained while paused, nothing twice
    store.engine.dispose()

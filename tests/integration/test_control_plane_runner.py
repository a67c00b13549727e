"""The control plane steering a real embedded runner on the random tiny model, over Postgres.

The database is the coordination point: the API writes what an operator asks, and
`cascade run --db postgresql://... --cascade-id N` reads it at every step boundary. Checked:
pause lands at a step boundary right after a checkpoint, nothing trains while paused, resume
continues from there (in the same process with --follow, or from the checkpoint with --resume),
advance ends a stage early, abort stops the run, and the step rows stay contiguous throughout.
"""

from __future__ import annotations

import json
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
from api_procs import REPO, WRITE_TOKEN, ApiServer, fresh_schema, running_api

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True, scope="module")
def _one_thread(torch_one_thread: None) -> Iterator[None]:
    yield


def runner_config(model: Path, out: Path, max_steps: tuple[int, int]) -> dict[str, Any]:
    grpo = {"group_size": 4, "prompts_per_step": 4, "budget": {"max_new_tokens": 8}}
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 32, "n_eval": 8}
    return {
        "name": "steered",
        "seed": 0,
        "model": {"path": str(model)},
        "domains": [{"name": "if", "prompts": prompts}, {"name": "math", "prompts": prompts}],
        "stages": [
            # No distillation: its teacher load and extra rollouts would only slow the plumbing down.
            {
                "domain": d,
                "grpo": grpo,
                "advance": {"max_steps": n},
                "eval": {"every": 1000},
                "distill": {"enabled": False},
            }
            for d, n in zip(("if", "math"), max_steps, strict=True)
        ],
        "checkpoint": {"every": 1000, "keep_last": 2},
        "output_dir": str(out),
    }


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


def stages(api: ApiServer, cascade_id: int) -> list[dict[str, Any]]:
    return api.call("GET", f"/api/cascades/{cascade_id}")[1]["stages"]


def command(api: ApiServer, stage_id: int, name: str) -> dict[str, Any]:
    status, out = api.call("POST", f"/api/stages/{stage_id}/{name}", token=WRITE_TOKEN)
    assert status == 200, out
    return out


def runs(api: ApiServer, cascade_id: int) -> list[dict[str, Any]]:
    return api.call("GET", f"/api/cascades/{cascade_id}")[1]["runs"]


def step_rows(api: ApiServer, cascade_id: int) -> list[tuple[int, int, int]]:
    steps = api.call("GET", f"/api/cascades/{cascade_id}/metrics")[1]["steps"]
    return [(s["stage_index"], s["step"], s["global_step"]) for s in steps]


def assert_contiguous(rows: list[tuple[int, int, int]]) -> None:
    assert [g for _, _, g in rows] == list(range(1, len(rows) + 1))
    for stage in {s for s, _, _ in rows}:
        mine = [st for s, st, _ in rows if s == stage]
        assert mine == list(range(1, len(mine) + 1))


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[ApiServer, str]]:
    with fresh_schema() as url, running_api(url, tmp_path) as api:
        yield api, url


def create(api: ApiServer, cfg: dict[str, Any], path: Path) -> int:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    status, body = api.call(
        "POST", "/api/cascades", token=WRITE_TOKEN, body=path.read_bytes(), content_type="application/yaml"
    )
    assert status == 201, body
    return int(body["id"])


def test_follow_pause_resume_advance_abort(
    plane: tuple[ApiServer, str], random_tiny_model: Path, tmp_path: Path
) -> None:
    api, url = plane
    cfg_path = tmp_path / "cascade.yaml"
    cascade_id = create(api, runner_config(random_tiny_model, tmp_path / "runs", (500, 500)), cfg_path)
    first, second = (s["id"] for s in stages(api, cascade_id))
    command(api, first, "start")  # an operator kicks the cascade off; the runner joins it
    argv = [sys.executable, "-m", "cascade.cli", "run", str(cfg_path), "--db", url]
    argv += ["--cascade-id", str(cascade_id), "--follow", "--no-progress"]
    log = (tmp_path / "runner.log").open("wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    runner = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for("3 steps", lambda: stages(api, cascade_id)[0]["steps_done"] >= 3, proc=runner)
        command(api, first, "pause")
        paused = wait_for("the pause", lambda: (st := stages(api, cascade_id)[0])["state"] == "paused" and st)
        k = paused["steps_done"]
        ckpts = api.call("GET", f"/api/cascades/{cascade_id}/checkpoints")[1]
        assert ckpts[-1]["kind"] == "resume" and ckpts[-1]["global_step"] == k  # checkpoint, then pause
        time.sleep(1.5)  # the runner polls every second: nothing may train meanwhile
        assert stages(api, cascade_id)[0]["steps_done"] == k and runner.poll() is None
        assert step_rows(api, cascade_id)[-1][2] == k

        command(api, first, "resume")
        wait_for("steps after resume", lambda: stages(api, cascade_id)[0]["steps_done"] >= k + 2, proc=runner)
        command(api, first, "advance")
        wait_for("stage 2", lambda: stages(api, cascade_id)[1]["steps_done"] >= 2, proc=runner)
        done = stages(api, cascade_id)[0]
        assert done["state"] == "completed" and done["steps_done"] < 500

        command(api, second, "pause")
        wait_for("the second pause", lambda: stages(api, cascade_id)[1]["state"] == "paused", proc=runner)
        status, out = api.call("POST", f"/api/cascades/{cascade_id}/abort", token=WRITE_TOKEN)
        assert status == 200 and out["changed"]
        assert runner.wait(timeout=60) == 0
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=10)
        log.close()
    _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    assert detail["status"] == "aborted"
    assert [s["state"] for s in detail["stages"]] == ["completed", "aborted"]
    assert [r["status"] for r in detail["runs"]] == ["aborted"]
    assert_contiguous(step_rows(api, cascade_id))
    events = api.call("GET", f"/api/cascades/{cascade_id}/events")[1]
    moves = [(e["from_state"], e["to_state"], e["actor"]) for e in events if e["kind"] == "transition"]
    assert moves == [
        ("pending", "running", "api:alice"),
        ("running", "paused", "runner"),
        ("paused", "running", "runner"),
        ("running", "completed", "runner"),
        ("pending", "running", "runner"),
        ("running", "paused", "runner"),
        ("paused", "aborted", "api:alice"),
    ]
    completed = next(e for e in events if e["kind"] == "transition" and e["to_state"] == "completed")
    assert completed["detail"]["stopped_by"] == "operator"


def test_pause_exits_and_resume_continues_from_the_checkpoint(
    plane: tuple[ApiServer, str], random_tiny_model: Path, tmp_path: Path
) -> None:
    """Without --follow a paused runner exits; `--resume` continues from the pause checkpoint."""
    from cascade.config import load_cascade_config
    from cascade.runner.embedded import embedded_runner

    api, url = plane
    cfg_path = tmp_path / "cascade.yaml"
    cascade_id = create(api, runner_config(random_tiny_model, tmp_path / "runs", (400, 3)), cfg_path)
    cfg = load_cascade_config(cfg_path)
    first, _ = (s["id"] for s in stages(api, cascade_id))
    run_dir = tmp_path / "runs" / "steered"

    def run(**kwargs: Any) -> Any:
        runner = embedded_runner(cfg, run_dir=run_dir, db_url=url, log=lambda _: None, **kwargs)
        return runner.run()

    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(run(cascade_id=cascade_id)))
    thread.start()
    try:
        wait_for("2 steps", lambda: stages(api, cascade_id)[0]["steps_done"] >= 2)
        command(api, first, "pause")
    finally:
        thread.join(timeout=120)
    assert results[0].stopped_by == "paused"
    k = stages(api, cascade_id)[0]["steps_done"]
    assert stages(api, cascade_id)[0]["state"] == "paused"
    out = command(api, first, "resume")
    assert out["stage"]["desired_state"] == "running"

    results.clear()
    thread = threading.Thread(target=lambda: results.append(run(resume=True)))
    thread.start()
    try:
        wait_for("steps after resume", lambda: stages(api, cascade_id)[0]["steps_done"] >= k + 1)
        state = stages(api, cascade_id)[0]
        assert (state["state"], state["desired_state"]) == ("running", None)
        command(api, first, "advance")
    finally:
        thread.join(timeout=180)
    assert results[0].stopped_by == "completed"
    _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    assert detail["status"] == "completed"
    assert [(s["state"], s["steps_done"]) for s in detail["stages"]][1] == ("completed", 3)
    assert [r["status"] for r in detail["runs"]] == ["completed"]
    assert_contiguous(step_rows(api, cascade_id))
    _, table = api.call("GET", f"/api/cascades/{cascade_id}/regression")
    assert [r["domain"] for r in table["rows"]] == ["if", "math"]


def test_sigkilled_runner_resumes_from_its_run_record(
    plane: tuple[ApiServer, str], random_tiny_model: Path, tmp_path: Path
) -> None:
    """kill -9 of `cascade run --db ... --cascade-id N` mid-stage, then `cascade run CFG --resume
    --run-dir DIR` with nothing else (the run directory recorded the database and the cascade):
    the steps after the checkpoint are redone once, the run completes, and every step equals an
    uninterrupted run's."""
    from cascade.config import load_cascade_config
    from cascade.runner.embedded import embedded_runner
    from cascade.runner.record import read_record

    api, url = plane
    cfg_path = tmp_path / "cascade.yaml"
    data = runner_config(random_tiny_model, tmp_path / "runs", (6, 3))
    data["checkpoint"] = {"every": 2, "keep_last": 2}
    data["lease"] = {"heartbeat_s": 0.5, "expiry_s": 3}
    cascade_id = create(api, data, cfg_path)
    run_dir = tmp_path / "runs" / "steered"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def start(*flags: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "cascade.cli", "run", str(cfg_path), "--no-progress", *flags]
        log = (tmp_path / "runner.log").open("ab")
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    runner = start("--db", url, "--cascade-id", str(cascade_id))
    try:
        wait_for("3 steps", lambda: stages(api, cascade_id)[0]["steps_done"] >= 3, proc=runner)
        live = runs(api, cascade_id)[0]
        assert live["status"] == "running" and live["holder"] and f"pid {runner.pid}" in live["holder"]
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(timeout=10)
        killed_at = time.monotonic()
        stalled = wait_for("stalled", lambda: (r := runs(api, cascade_id)[0])["status"] == "stalled" and r)
        assert time.monotonic() - killed_at < 3 + 2  # within the lease expiry (+ polling)
        assert stalled["holder"] is None and stalled["heartbeat_at"] is not None
        record = read_record(run_dir)
        assert record is not None and record.kind == "embedded" and record.cascade_id == cascade_id
        assert record.db_url == url  # no password here: recorded as given
        runner = start("--resume", "--run-dir", str(run_dir))
        assert runner.wait(timeout=180) == 0, (tmp_path / "runner.log").read_text()[-3000:]
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=10)
    _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    assert detail["status"] == "completed"
    assert [(r["kind"], r["status"]) for r in detail["runs"]] == [("embedded", "completed")]
    rows = step_rows(api, cascade_id)
    assert_contiguous(rows)
    assert len(rows) == 9
    assert [st["steps_done"] for st in detail["stages"]] == [6, 3]  # counters follow the rows
    assert "resumed from step-00000" in (tmp_path / "runner.log").read_text()

    reference = embedded_runner(
        load_cascade_config(cfg_path), run_dir=tmp_path / "reference", log=lambda _: None
    )
    assert reference.run().stopped_by == "completed"
    from sqlalchemy import text

    from cascade.store.db import make_engine

    def metrics(db: str) -> list[dict[str, Any]]:
        engine = make_engine(db)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT metrics FROM steps ORDER BY global_step")).all()
        engine.dispose()
        out = [json.loads(m) if isinstance(m, str) else m for (m,) in rows]
        timing = (
            "time_rollout_s",
            "time_loss_s",
            "time_update_s",
            "time_step_s",
            "time_wait_s",
            "idle_fraction",
        )
        return [{k: v for k, v in m.items() if k not in timing} for m in out]

    assert metrics(url) == metrics(f"sqlite:///{tmp_path / 'reference' / 'cascade.db'}")


def test_one_runner_per_cascade_and_the_config_trained_is_the_stored_one(
    plane: tuple[ApiServer, str], random_tiny_model: Path, tmp_path: Path
) -> None:
    """A YAML that differs from the cascade's stored config in a training setting is refused
    with the field named; two runners started together on one cascade (one with the YAML, one
    with no YAML: the stored config) -> exactly one trains, the other is refused naming the
    holder's host and pid."""
    api, url = plane
    cfg_path = tmp_path / "cascade.yaml"
    data = runner_config(random_tiny_model, tmp_path / "runs", (10, 2))  # the winner outlives the race
    cascade_id = create(api, data, cfg_path)
    other = dict(data, stages=[dict(st) for st in data["stages"]])
    other["stages"][1] = {**other["stages"][1], "grpo": {**data["stages"][1]["grpo"], "learning_rate": 3e-4}}
    other["output_dir"] = str(tmp_path / "elsewhere")  # not a training setting: may differ
    other_path = tmp_path / "other.yaml"
    other_path.write_text(yaml.safe_dump(other, sort_keys=False))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "cascade.cli", "run"]
    flags = ["--db", url, "--cascade-id", str(cascade_id), "--no-progress"]
    refused = subprocess.run(
        [*base, str(other_path), *flags], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2, refused.stderr
    assert "stages.1.grpo.learning_rate" in refused.stderr and "output_dir" not in refused.stderr
    assert runs(api, cascade_id) == []  # nothing was created

    def start(*argv: str, name: str) -> subprocess.Popen[str]:
        out = (tmp_path / f"{name}.log").open("w")
        return subprocess.Popen(
            [*base, *argv, *flags, "--run-dir", str(tmp_path / name)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    first = start(str(cfg_path), name="with-yaml")
    second = start(name="stored-config")
    try:
        codes = sorted([first.wait(timeout=180), second.wait(timeout=180)])
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in ("with-yaml", "stored-config")}
    assert codes == [0, 2], logs
    loser = next(text for text in logs.values() if "is being run by" in text)
    assert "pid" in loser and "since" in loser, loser
    _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    assert detail["status"] == "completed"
    assert [(r["status"], r["holder"]) for r in detail["runs"]] == [("completed", None)]
    assert_contiguous(step_rows(api, cascade_id))

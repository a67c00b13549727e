"""A second `cascade up` on a cascade a live runner holds is refused before it starts any process
(the issue's drill saw seven start first): the lease is read from the store named by `--db
--cascade-id` (Postgres) or recorded in the run directory's `run.json` (its SQLite)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from pg_schema import fresh_schema

from cascade.cli.main import main as cli_main
from cascade.config import load_cascade_config
from cascade.runner.record import RunRecord, write_record
from cascade.runner.run_store import RunStore
from cascade.store import db, leases
from cascade.store.leases import Holder
from cascade.up.preflight import refusal


def _config(tmp_path: Path) -> Path:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 8, "n_eval": 4}
    data = {
        "name": "held",
        "model": {"path": str(tmp_path / "model")},
        "domains": [{"name": "math", "prompts": prompts}],
        "stages": [{"domain": "math", "advance": {"max_steps": 2}}],
        "output_dir": str(tmp_path / "runs"),
    }
    path = tmp_path / "cascade.yaml"
    path.write_text(yaml.safe_dump(data))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # never loaded: nothing starts
    return path


def _hold(url: str, cfg_path: Path, run_dir: Path, holder: Holder) -> tuple[RunStore, int]:
    store = RunStore(url)
    ids = store.begin(
        load_cascade_config(cfg_path), run_dir=run_dir, distill=True, kind="distributed", holder=holder
    )
    return store, int(ids["cascade_id"])


def test_a_second_up_on_a_held_postgres_cascade_starts_nothing(
    tmp_path: Path, popen_calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path)
    logs = tmp_path / "second-logs"
    with fresh_schema() as url:
        live = Holder.this_process(uuid.uuid4().hex)  # this test process: alive, on this host
        store, cascade_id = _hold(url, cfg, tmp_path / "first", live)
        try:
            argv = ["up", str(cfg), "--db", url, "--cascade-id", str(cascade_id)]
            argv += ["--run-dir", str(tmp_path / "second"), "--log-dir", str(logs)]
            assert cli_main(argv) == 2
            err = capsys.readouterr().err
            assert f"cascade {cascade_id} is being run by" in err and f"pid {live.pid}" in err, err
            assert "nothing was started" in err
            assert popen_calls == [] and not logs.exists() and not (tmp_path / "second").exists()

            store.release_lease(live.token)  # the runner stopped: the same command may start
            assert (
                refusal(tmp_path / "second", db_url=url, cascade_id=cascade_id, resume=False, fresh=False)
                is None
            )
        finally:
            store.engine.dispose()


def test_a_second_up_resuming_a_held_run_dir_starts_nothing(
    tmp_path: Path, popen_calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The run directory's own SQLite, named by its run.json: `--resume` is refused while the
    runner lives, plain `up` on the same directory always (it holds a run)."""
    cfg = _config(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    url = f"sqlite:///{(run_dir / 'cascade.db').resolve()}"
    live = Holder.this_process(uuid.uuid4().hex)
    store, cascade_id = _hold(url, cfg, run_dir, live)
    record = RunRecord(config={}, distill=True, kind="distributed", db_url=url, cascade_id=cascade_id)
    write_record(run_dir, record)
    logs = tmp_path / "logs"
    try:
        base = ["up", str(cfg), "--run-dir", str(run_dir), "--log-dir", str(logs)]
        assert cli_main([*base, "--resume"]) == 2
        err = capsys.readouterr().err
        assert f"cascade {cascade_id} is being run by" in err and "nothing was started" in err, err
        assert cli_main(base) == 2
        assert f"{run_dir} already holds a run: pass --resume" in capsys.readouterr().err
        assert popen_calls == [] and not logs.exists()

        # a runner killed -9 leaves its lease unexpired, but its pid is gone: not refused
        gone = subprocess.Popen(["true"])
        gone.wait()
        store.release_lease(live.token)
        with db.session_scope(store.engine) as s:
            dead = Holder(token="dead", host=live.host, pid=gone.pid)
            leases.acquire(s, cascade_id=cascade_id, run_id=None, holder=dead, expiry_s=600)
        assert refusal(run_dir, db_url=None, cascade_id=None, resume=True, fresh=False) is None
    finally:
        store.engine.dispose()


def test_up_with_a_missing_model_starts_nothing(
    tmp_path: Path, popen_calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path)
    (tmp_path / "model" / "config.json").unlink()
    assert (
        cli_main(["up", str(cfg), "--run-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "logs")])
        == 2
    )
    assert "model.path:" in capsys.readouterr().err
    assert popen_calls == [] and not (tmp_path / "logs").exists()

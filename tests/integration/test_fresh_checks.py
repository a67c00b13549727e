"""`--fresh` checks everything before it changes anything on disk, and then deletes nothing.

The two cases of issue 21: `--fresh --yes` against a live run (its lease held by a live process)
and against a completed control-plane cascade must leave the run directory exactly as it was
(run.json, checkpoints, teachers); a directory that is not a run's is not moved; a run whose
runner is dead is moved aside to `<run>.old-<time>`, intact. Re-joining a cascade that has
history needs `--resume` or `--fresh`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.config import CascadeConfig
from cascade.runner.embedded import embedded_runner
from cascade.runner.record import RunRecord, write_record
from cascade.runner.run_state import RunDirError
from cascade.runner.run_store import CascadeHasHistory, CascadeMismatch, LeaseHeld, RunStore
from cascade.store import db
from cascade.store.leases import Holder
from cascade.store.models import RunLease

REPO = Path(__file__).resolve().parents[2]
SQLITE_FILES = ("cascade.db", "cascade.db-wal", "cascade.db-shm")
"""The run's own SQLite database: opened to read its lease, its WAL files may come and go."""


def config(model: Path, out: Path) -> CascadeConfig:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 16, "n_eval": 4}
    grpo = {"group_size": 2, "prompts_per_step": 2, "budget": {"max_new_tokens": 4}}
    return CascadeConfig.model_validate(
        {
            "name": "fresh",
            "model": {"path": str(model)},
            "domains": [{"name": "math", "prompts": prompts}],
            "stages": [{"domain": "math", "grpo": grpo, "advance": {"max_steps": 2}}],
            "lease": {"heartbeat_s": 1, "expiry_s": 60},
            "output_dir": str(out),
        }
    )


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with its content's hash (the SQLite files by name only)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            rel = str(path.relative_to(root))
            if path.name in SQLITE_FILES:
                out[rel] = "sqlite" if path.name == "cascade.db" else ""
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {k: v for k, v in out.items() if not k.endswith(("-wal", "-shm"))}


def make_run(cfg: CascadeConfig, run_dir: Path, url: str, *, cascade_id: int | None = None) -> RunStore:
    """A run as a runner leaves it: its rows and lease (held by this live process), run.json,
    a checkpoint and a teacher."""
    run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(url)
    holder = Holder.this_process(uuid.uuid4().hex)
    ids = store.begin(cfg, run_dir=run_dir, distill=True, cascade_id=cascade_id, holder=holder)
    write_record(
        run_dir,
        RunRecord.make(
            config=cfg, distill=True, kind="embedded", db_url=url, cascade_id=ids["cascade_id"], sources={}
        ),
    )
    for sub in ("checkpoints/step-000002", "teachers/math-g000002"):
        (run_dir / sub).mkdir(parents=True)
        (run_dir / sub / "model.safetensors").write_bytes(os.urandom(256))
    return store


def expire_lease(store: RunStore) -> None:
    """The holder stopped beating, as a runner on another host does when it dies (one on this
    host whose pid is alive is never taken for dead)."""
    with db.session_scope(store.engine) as s:
        for lease in s.query(RunLease):
            lease.expires_at = lease.heartbeat_at - timedelta(seconds=1)
            lease.host = "another-host"


def asides(run_dir: Path) -> list[Path]:
    return sorted(run_dir.parent.glob(f"{run_dir.name}.old-*"))


def test_fresh_against_a_live_run_changes_nothing(random_tiny_model: Path, tmp_path: Path) -> None:
    cfg = config(random_tiny_model, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "fresh"
    store = make_run(cfg, run_dir, f"sqlite:///{run_dir / 'cascade.db'}")
    before = snapshot(run_dir)
    with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
        embedded_runner(cfg, run_dir=run_dir, fresh=True, log=lambda _: None)
    assert snapshot(run_dir) == before and not asides(run_dir)

    cfg_path = tmp_path / "cascade.yaml"  # the CLI, as the issue ran it
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    argv = [sys.executable, "-m", "cascade.cli", "run", str(cfg_path), "--run-dir", str(run_dir)]
    done = subprocess.run(
        [*argv, "--fresh", "--yes", "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "being run by" in done.stderr and "Traceback" not in done.stderr
    assert snapshot(run_dir) == before and not asides(run_dir)
    store.engine.dispose()


@pytest.mark.postgres
def test_fresh_against_a_completed_cascade_changes_nothing(
    random_tiny_model: Path, tmp_path: Path, postgres_url: str
) -> None:
    cfg = config(random_tiny_model, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "fresh"
    store = make_run(cfg, run_dir, postgres_url)
    cascade_id = store.cascade_id
    store.finish("completed")
    with db.session_scope(store.engine) as s:
        s.query(RunLease).delete()
    before = snapshot(run_dir)
    with pytest.raises(CascadeMismatch, match="is completed"):
        embedded_runner(
            cfg, run_dir=run_dir, db_url=postgres_url, cascade_id=cascade_id, fresh=True, log=lambda _: None
        )
    assert snapshot(run_dir) == before and not asides(run_dir)
    store.engine.dispose()


@pytest.mark.postgres
def test_fresh_against_a_live_control_plane_run_changes_nothing(
    random_tiny_model: Path, tmp_path: Path, postgres_url: str
) -> None:
    """The run's database is Postgres: the lease is read there (from run.json), and the cascade
    given is checked (held by a live runner) before anything moves."""
    cfg = config(random_tiny_model, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "fresh"
    store = make_run(cfg, run_dir, postgres_url)
    before = snapshot(run_dir)
    for cascade_id in (None, store.cascade_id):
        with pytest.raises(LeaseHeld):
            embedded_runner(
                cfg,
                run_dir=run_dir,
                db_url=postgres_url,
                cascade_id=cascade_id,
                fresh=True,
                log=lambda _: None,
            )
    assert snapshot(run_dir) == before and not asides(run_dir)
    store.engine.dispose()


def test_fresh_moves_a_dead_run_aside_intact(random_tiny_model: Path, tmp_path: Path) -> None:
    cfg = config(random_tiny_model, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "fresh"
    store = make_run(cfg, run_dir, f"sqlite:///{run_dir / 'cascade.db'}")
    expire_lease(store)  # its runner died (kill -9): the lease aged out
    store.engine.dispose()
    before = snapshot(run_dir)
    lines: list[str] = []
    runner = embedded_runner(cfg, run_dir=run_dir, fresh=True, log=lines.append)
    runner.close()
    runner.store.engine.dispose()
    [old] = asides(run_dir)
    assert snapshot(old) == before
    assert any(str(old) in line for line in lines)  # the operator is told where it went
    assert not (run_dir / "checkpoints").exists()


def test_fresh_refuses_a_directory_that_is_not_a_run(random_tiny_model: Path, tmp_path: Path) -> None:
    cfg = config(random_tiny_model, tmp_path / "runs")
    run_dir = tmp_path / "home"
    run_dir.mkdir()
    (run_dir / "thesis.tex").write_text("years of work")
    with pytest.raises(RunDirError, match="does not look like a run directory"):
        embedded_runner(cfg, run_dir=run_dir, fresh=True, log=lambda _: None)
    assert (run_dir / "thesis.tex").read_text() == "years of work" and not asides(run_dir)


def test_a_run_directory_inside_another_run_is_refused_before_anything_is_written(
    random_tiny_model: Path, tmp_path: Path
) -> None:
    """Issue 34: a run directory that resolves into another run's (`..`, a symlink) wrote into it:
    its run.json overwritten, its samples log appended to, its checkpoint pruned."""
    cfg = config(random_tiny_model, tmp_path / "runs")
    other = tmp_path / "runs" / "other"
    store = make_run(cfg, other, f"sqlite:///{other / 'cascade.db'}")
    store.engine.dispose()
    before = snapshot(other)
    (tmp_path / "link").symlink_to(other)
    dotted = tmp_path / "runs" / "x" / ".." / "other" / "inner"
    for run_dir in (other / "inner", dotted, tmp_path / "link" / "y"):
        for kwargs in ({}, {"resume": True}, {"fresh": True}):
            with pytest.raises(RunDirError, match=f"inside the run directory {other}"):
                embedded_runner(cfg, run_dir=run_dir, log=lambda _: None, **kwargs)
    assert snapshot(other) == before and not (other / "inner").exists()


@pytest.mark.postgres
def test_rejoining_a_cascade_with_history_needs_resume_or_fresh(
    random_tiny_model: Path, tmp_path: Path, postgres_url: str
) -> None:
    cfg = config(random_tiny_model, tmp_path / "runs")
    first = make_run(cfg, tmp_path / "runs" / "first", postgres_url)
    expire_lease(first)  # the first runner died
    store = RunStore(postgres_url)
    begin: dict[str, Any] = dict(run_dir=tmp_path / "second", distill=True, cascade_id=first.cascade_id)
    with pytest.raises(CascadeHasHistory) as refused:
        store.begin(cfg, holder=Holder.this_process(uuid.uuid4().hex), **begin)
    assert "--resume" in str(refused.value) and "--fresh" in str(refused.value)
    assert str(tmp_path / "runs" / "first") in str(refused.value)  # where its run directory is
    ids = store.begin(cfg, holder=Holder.this_process(uuid.uuid4().hex), rejoin=True, **begin)
    assert ids["cascade_id"] == first.cascade_id and ids["run_id"] != first.run_id
    for s in (first, store):
        s.engine.dispose()

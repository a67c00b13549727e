"""The store against real databases: the same suite on a SQLite file and on the local Postgres.

The embedded runner writes SQLite and the control plane Postgres through the same models, so
every rule (state machine, event log, one teacher per domain, unique keys, foreign keys) is
checked on both backends.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import pytest
from sqlalchemy import Engine, delete, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cascade.runner.report import write_report
from cascade.store import repo
from cascade.store.db import create_all, make_engine, session_scope
from cascade.store.models import STAGE_STATES, Cascade, Checkpoint, Eval, Event, Stage, Step

# Written out here, not imported: the test must fail if the implementation's table drifts.
LEGAL = {
    ("pending", "running"),
    ("running", "paused"),
    ("paused", "running"),
    ("running", "completed"),
    ("running", "failed"),
    ("running", "aborted"),
    ("paused", "aborted"),
    ("pending", "aborted"),
}
PATH_TO = {
    "pending": [],
    "running": ["running"],
    "paused": ["running", "paused"],
    "completed": ["running", "completed"],
    "failed": ["running", "failed"],
    "aborted": ["aborted"],
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    eng = make_engine(request.getfixturevalue(f"{request.param}_url"))
    create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with session_scope(engine) as s:
        yield s


def _cascade(session: Session, stages: list[tuple[str, str]] | None = None) -> tuple[Cascade, list[Stage]]:
    stages = stages or [("math", "math"), ("code", "code")]
    config = {"name": "t", "domains": [{"name": d} for d in dict.fromkeys(d for _, d in stages)]}
    cascade = repo.create_cascade(session, name="t", config=config)
    return cascade, repo.create_stages(session, cascade_id=cascade.id, stages=stages)


def _events(session: Session, cascade_id: int, kind: str | None = None) -> list[Event]:
    return [e for e in repo.list_events(session, cascade_id=cascade_id) if kind is None or e.kind == kind]


# --------------------------------------------------------------------------- engine


def test_postgres_urls_use_psycopg3() -> None:
    for url in ("postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"):
        assert make_engine(url).url.drivername == "postgresql+psycopg"


def test_sqlite_has_foreign_keys_and_wal(tmp_path) -> None:
    eng = make_engine(f"sqlite:///{tmp_path / 'nested' / 'dir' / 'cascade.db'}")
    with eng.connect() as conn:
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    eng.dispose()


# --------------------------------------------------------------------------- state machine


def test_every_transition_legal_or_refused(session: Session) -> None:
    pairs = [(a, b) for a in STAGE_STATES for b in STAGE_STATES if a != b]
    # One cascade per pair: a cascade has at most one running or paused stage.
    for current, requested in pairs:
        cascade, (stage,) = _cascade(session, [("s", "math")])
        for state in PATH_TO[current]:
            repo.transition_stage(session, stage_id=stage.id, to_state=state, actor="setup")
        before = len(_events(session, cascade.id))
        if (current, requested) in LEGAL:
            moved = repo.transition_stage(session, stage_id=stage.id, to_state=requested, actor="op")
            assert moved.state == requested
            last = _events(session, cascade.id)[-1]
            assert (last.stage_id, last.from_state, last.to_state, last.actor) == (
                stage.id, current, requested, "op",
            )  # fmt: skip
        else:
            with pytest.raises(repo.IllegalTransition) as err:
                repo.transition_stage(session, stage_id=stage.id, to_state=requested, actor="op")
            assert (err.value.current, err.value.requested) == (current, requested)
            assert session.get(Stage, stage.id).state == current
            assert len(_events(session, cascade.id)) == before


def test_repeat_is_a_noop_without_event(session: Session) -> None:
    cascade, (stage, _) = _cascade(session)
    first = repo.transition_stage(session, stage_id=stage.id, to_state="running", actor="runner")
    started = first.started_at
    again = repo.transition_stage(session, stage_id=stage.id, to_state="running", actor="runner")
    assert again.state == "running" and again.started_at == started
    assert len(_events(session, cascade.id, "transition")) == 1
    with pytest.raises(ValueError, match="unknown stage state"):
        repo.transition_stage(session, stage_id=stage.id, to_state="done", actor="runner")
    with pytest.raises(repo.NotFound):
        repo.transition_stage(session, stage_id=10**6, to_state="running", actor="runner")


def test_event_log_and_timestamps(engine: Engine) -> None:
    with session_scope(engine) as s:
        cascade, (stage, _) = _cascade(s)
        ids = cascade.id, stage.id
    moves = [
        ("running", "runner"),
        ("paused", "api:alice"),
        ("running", "api:alice"),
        ("completed", "runner"),
    ]
    for state, actor in moves:
        with session_scope(engine) as s:
            repo.transition_stage(s, stage_id=ids[1], to_state=state, actor=actor, detail={"why": state})
    with session_scope(engine) as s:
        events = _events(s, ids[0], "transition")
        assert [(e.from_state, e.to_state, e.actor) for e in events] == [
            ("pending", "running", "runner"),
            ("running", "paused", "api:alice"),
            ("paused", "running", "api:alice"),
            ("running", "completed", "runner"),
        ]
        assert events[-1].detail == {"why": "completed"}
        assert all(e.at.tzinfo is not None for e in events)
        assert [e.at for e in events] == sorted(e.at for e in events)
        stage = s.get(Stage, ids[1])
        assert stage.started_at is not None and stage.ended_at is not None
        assert stage.started_at.tzinfo is not None and stage.started_at <= stage.ended_at
        events[0].actor = "someone else"
        with pytest.raises(RuntimeError, match="append-only"):
            s.flush()
        s.rollback()


def test_operator_requests(session: Session) -> None:
    cascade, (stage, _) = _cascade(session)
    with pytest.raises(repo.IllegalTransition):
        repo.request_stage_state(session, stage_id=stage.id, desired_state="paused", actor="api:bob")
    repo.transition_stage(session, stage_id=stage.id, to_state="running", actor="runner")
    repo.request_stage_state(session, stage_id=stage.id, desired_state="paused", actor="api:bob")
    repo.request_stage_state(session, stage_id=stage.id, desired_state="paused", actor="api:bob")
    assert repo.requested_state(session, stage_id=stage.id) == "paused"
    requests = _events(session, cascade.id, "request")
    assert [(e.to_state, e.actor) for e in requests] == [("paused", "api:bob")]
    repo.transition_stage(session, stage_id=stage.id, to_state="paused", actor="runner")
    assert repo.requested_state(session, stage_id=stage.id) is None
    repo.request_stage_state(session, stage_id=stage.id, desired_state="aborted", actor="api:bob")
    repo.request_stage_state(session, stage_id=stage.id, desired_state="paused", actor="api:carol")
    assert repo.requested_state(session, stage_id=stage.id) is None  # withdrawn
    repo.request_stage_state(session, stage_id=stage.id, desired_state="aborted", actor="api:bob")
    repo.transition_stage(session, stage_id=stage.id, to_state="aborted", actor="runner")
    assert repo.requested_state(session, stage_id=stage.id) is None


def test_run_lifecycle(session: Session) -> None:
    cascade, _ = _cascade(session)
    run = repo.start_run(session, cascade_id=cascade.id, seed=3, distill=True, output_dir="runs/t")
    assert (run.status, run.kind, run.ended_at) == ("running", "embedded", None)
    repo.finish_run(session, run_id=run.id, status="completed")
    repo.finish_run(session, run_id=run.id, status="completed")
    assert run.ended_at is not None
    with pytest.raises(repo.IllegalTransition):
        repo.finish_run(session, run_id=run.id, status="failed")
    assert [e.kind for e in _events(session, cascade.id)] == ["run_started", "run_finished"]
    with pytest.raises(ValueError):
        repo.start_run(session, cascade_id=cascade.id, seed=0, distill=False, output_dir="x", kind="k8s")


# --------------------------------------------------------------------------- teachers


def test_one_teacher_per_domain(session: Session) -> None:
    cascade, (s_math, s_code) = _cascade(session)
    run = repo.start_run(session, cascade_id=cascade.id, seed=0, distill=True, output_dir="out")

    def ckpt(stage: Stage, step: int, domain: str, score: float) -> Checkpoint:
        return repo.record_checkpoint(
            session,
            run_id=run.id,
            stage_id=stage.id,
            step=step,
            global_step=step,
            path=f"ckpt/{step}",
            kind="teacher",
            domain=domain,
            score=score,
        )

    m1, m2, c1 = ckpt(s_math, 10, "math", 0.5), ckpt(s_math, 20, "math", 0.9), ckpt(s_code, 30, "code", 0.4)
    repo.mark_teacher(session, run_id=run.id, domain="math", checkpoint_id=m1.id)
    repo.mark_teacher(session, run_id=run.id, domain="code", checkpoint_id=c1.id)
    repo.mark_teacher(session, run_id=run.id, domain="math", checkpoint_id=m2.id)
    repo.mark_teacher(session, run_id=run.id, domain="math", checkpoint_id=m2.id)
    assert {d: c.id for d, c in repo.teachers(session, run_id=run.id).items()} == {
        "math": m2.id,
        "code": c1.id,
    }
    n_teachers = session.scalar(
        select(func.count()).where(Checkpoint.run_id == run.id, Checkpoint.is_teacher.is_(True))
    )
    assert n_teachers == 2
    events = _events(session, cascade.id, "teacher")
    assert [(e.detail["domain"], e.detail["checkpoint_id"], e.detail["previous"]) for e in events] == [
        ("math", m1.id, None), ("code", c1.id, None), ("math", m2.id, m1.id),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="scored on"):
        repo.mark_teacher(session, run_id=run.id, domain="math", checkpoint_id=c1.id)
    # The database refuses a second teacher even when the repository is bypassed.
    with pytest.raises(IntegrityError):
        with session.begin_nested():
            session.execute(update(Checkpoint).where(Checkpoint.id == m1.id).values(is_teacher=True))


# --------------------------------------------------------------------------- constraints


def test_unique_and_foreign_keys_enforced(session: Session) -> None:
    cascade, (stage, _) = _cascade(session)
    run = repo.start_run(session, cascade_id=cascade.id, seed=0, distill=False, output_dir="out")
    repo.record_step(session, run_id=run.id, stage_id=stage.id, step=1, global_step=1, metrics={"loss": 1.0})
    repo.record_eval(
        session, run_id=run.id, stage_id=stage.id, step=0, global_step=0, domain="math", score=0.5, n=8
    )
    duplicates = [
        Stage(cascade_id=cascade.id, index=0, name="again", domain="math"),
        Step(run_id=run.id, stage_id=stage.id, step=1, global_step=1, metrics={}),
        Eval(run_id=run.id, stage_id=stage.id, step=0, global_step=0, domain="math", score=0.1, n=1),
        Step(run_id=10**6, stage_id=stage.id, step=5, global_step=5, metrics={}),
    ]
    for row in duplicates:
        with pytest.raises(IntegrityError), session.begin_nested():
            session.add(row)
            session.flush()
    with pytest.raises(IntegrityError), session.begin_nested():
        session.execute(update(Stage).where(Stage.id == stage.id).values(state="bogus"))
    with pytest.raises(repo.NotFound):
        repo.record_step(session, run_id=10**6, stage_id=stage.id, step=2, global_step=2, metrics={})


def test_json_is_portable_and_cascade_delete(session: Session) -> None:
    cascade, (stage, _) = _cascade(session)
    run = repo.start_run(session, cascade_id=cascade.id, seed=0, distill=False, output_dir="out")
    metrics = {"loss": np.float32(0.25), "ratio": float("nan"), "n": np.int64(3), "v": [1.0, math.inf]}
    repo.record_step(session, run_id=run.id, stage_id=stage.id, step=1, global_step=1, metrics=metrics)
    session.expire_all()
    stored = session.scalars(select(Step.metrics)).one()
    assert stored == {"loss": 0.25, "ratio": None, "n": 3, "v": [1.0, None]}
    assert session.get(Stage, stage.id).steps_done == 1
    session.execute(delete(Cascade).where(Cascade.id == cascade.id))
    assert session.scalar(select(func.count()).select_from(Step)) == 0
    assert session.scalar(select(func.count()).select_from(Event)) == 0


# --------------------------------------------------------------------------- report queries


def _fake_run(session: Session) -> int:
    """Two stages; math peaks at 97.6% after its stage and falls to 71.8% during code's."""
    cascade, stages = _cascade(session)
    run = repo.start_run(session, cascade_id=cascade.id, seed=0, distill=False, output_dir="out")
    evals = [  # stage, step, global step, math, code
        (0, 0, 0, 0.41, 0.10), (0, 10, 10, 0.80, 0.12), (0, 20, 20, 0.976, 0.11),
        (1, 0, 20, 0.976, 0.11), (1, 10, 30, 0.85, 0.60), (1, 20, 40, 0.718, 0.97),
    ]  # fmt: skip
    for index, step, global_step, math_score, code_score in evals:
        for domain, score in (("math", math_score), ("code", code_score)):
            repo.record_eval(
                session,
                run_id=run.id,
                stage_id=stages[index].id,
                step=step,
                global_step=global_step,
                domain=domain,
                score=score,
                n=64,
                reasons={"ok": round(64 * score), "wrong_answer": 64 - round(64 * score)},
            )
    for index, stage in enumerate(stages):
        for step in range(1, 21):
            repo.record_step(
                session,
                run_id=run.id,
                stage_id=stage.id,
                step=step,
                global_step=20 * index + step,
                metrics={"loss": 1.0 / step},
            )
    return run.id


def test_history_final_evals_and_regression_table(session: Session, tmp_path) -> None:
    run_id = _fake_run(session)
    history = repo.eval_history(session, run_id)
    assert [e.global_step for e in history] == sorted(e.global_step for e in history)
    assert len(history) == 12
    finals = repo.stage_final_evals(session, run_id)
    assert {i: {d: (e.step, e.score) for d, e in by.items()} for i, by in finals.items()} == {
        0: {"math": (20, 0.976), "code": (20, 0.11)},
        1: {"math": (20, 0.718), "code": (20, 0.97)},
    }
    table = repo.regression_table(session, run_id)
    assert table.columns == ["domain", "start", "after math", "after code", "best", "final - best"]
    math_row, code_row = table.row("math"), table.row("code")
    assert (math_row.start, math_row.after, math_row.best) == (0.41, [0.976, 0.718], 0.976)
    assert math_row.final_minus_best == pytest.approx(-0.258)
    assert (code_row.start, code_row.after, code_row.best, code_row.final_minus_best) == (
        0.10, [0.11, 0.97], 0.97, 0.0,
    )  # fmt: skip
    loaded = repo.load_history(session, run_id)
    assert [(s.label, s.start_global_step, s.end_global_step) for s in loaded.stages] == [
        ("math", 0, 20), ("code", 20, 40),
    ]  # fmt: skip
    assert len(loaded.steps) == 40 and loaded.domains == ["math", "code"]

    files = write_report(session, run_id, tmp_path / "report")
    assert "| math | 41.0% | 97.6% | 71.8% | 97.6% | -25.8 pp |" in files.regression_md.read_text()
    assert json.loads(files.metrics_json.read_text())["run"]["seed"] == 0
    assert files.curves.read_bytes().startswith(b"\x89PNG")

    assert repo.discard_after(session, run_id=run_id, global_step=30) == 10 + 2
    assert repo.eval_history(session, run_id)[-1].global_step == 30

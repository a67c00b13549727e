"""Both modes are one loop: the embedded run and the distributed learner are the same
`CascadeRunner` class, built with different sources, and nothing subclasses it.

A feature added to the loop (an operator command, a metric, a sampling setting) therefore
reaches both modes by construction; only the three source interfaces may differ.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from cascade.config import load_cascade_config
from cascade.runner.embedded import embedded_runner
from cascade.runner.local import InPlaceWeights, LocalRollouts, LocalTeachers
from cascade.runner.loop import CascadeRunner
from cascade.runner.record import RunRecord, public_db_url, read_record, resume_command, write_record
from cascade.runner.sources import RolloutSource, TeacherSource, WeightSink


def _config(tmp_path: Path, model: Path) -> Path:
    import yaml

    prompts = {"kind": "synthetic", "seed": 0, "n_train": 16, "n_eval": 4}
    data = {
        "name": "modes",
        "model": {"path": str(model)},
        "domains": [{"name": "if", "prompts": prompts}, {"name": "math", "prompts": prompts}],
        "stages": [{"domain": "if"}, {"domain": "math", "distill": {"loss": "sampled"}}],
        "output_dir": str(tmp_path / "runs"),
    }
    path = tmp_path / "cascade.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_both_modes_build_the_same_loop_class(tmp_path: Path, random_tiny_model: Path) -> None:
    from services.learner.learner import distributed_runner
    from services.learner.sources import ServiceTeachers, StreamRollouts

    cfg = load_cascade_config(_config(tmp_path, random_tiny_model))
    embedded = embedded_runner(cfg, run_dir=tmp_path / "e")
    # constructing the distributed runner connects to nothing yet (channels and Redis are lazy)
    distributed = distributed_runner(
        cfg,
        run_dir=tmp_path / "d",
        redis_url="redis://127.0.0.1:1/0",
        stream_prefix="test:modes",
        rollout="127.0.0.1:1",
        teacher="127.0.0.1:1",
    )
    try:
        assert type(embedded) is CascadeRunner and type(distributed) is CascadeRunner
        assert CascadeRunner.__subclasses__() == []
        assert isinstance(embedded.sources.rollouts, LocalRollouts)
        assert isinstance(embedded.sources.teachers, LocalTeachers)
        assert isinstance(embedded.sources.weights, InPlaceWeights)
        assert isinstance(distributed.sources.rollouts, StreamRollouts)
        assert isinstance(distributed.sources.teachers, ServiceTeachers)
        assert distributed.sources.weights is distributed.sources.rollouts
        assert (
            embedded.sources.rollouts.kind == "embedded"
            and distributed.sources.rollouts.kind == "distributed"
        )
        # generation runs elsewhere: every request is seeded, whatever the config says
        assert cfg.rollout.seeding == "stream"
        assert not embedded.per_request and distributed.per_request
    finally:
        distributed.close()
        embedded.close()


@pytest.mark.parametrize(
    ("cls", "protocol"),
    [
        ("cascade.runner.local.LocalRollouts", RolloutSource),
        ("services.learner.sources.StreamRollouts", RolloutSource),
        ("cascade.runner.local.LocalTeachers", TeacherSource),
        ("services.learner.sources.ServiceTeachers", TeacherSource),
        ("services.learner.sources.NoTeachers", TeacherSource),
        ("cascade.runner.local.InPlaceWeights", WeightSink),
        ("services.learner.sources.StreamRollouts", WeightSink),
    ],
)
def test_every_source_implements_its_whole_interface(cls: str, protocol: type) -> None:
    import importlib

    module, name = cls.rsplit(".", 1)
    impl = getattr(importlib.import_module(module), name)
    wanted = {n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}
    for method in wanted:
        assert callable(getattr(impl, method, None)), f"{cls} lacks {method}"
        want = list(inspect.signature(getattr(protocol, method)).parameters)
        have = list(inspect.signature(getattr(impl, method)).parameters)
        assert have == want, (cls, method, have, want)


def test_the_worker_calls_the_embedded_rollout_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollout worker's `handle` is `generate_and_score` (the embedded run's rollout of one
    request) with the rollout and reward services behind it, then publish, then ack."""
    import argparse

    import cascade.rollout.scoring
    import cascade.transport.redis_streams
    from cascade.resilience import Dependency
    from cascade.rollout.requests import PromptRequest, ScoredChunk
    from services.rollout.worker import Worker

    req = PromptRequest(
        batch=3, index=1, domain="math", policy_version=5, seed=11, group_size=2, max_tokens=4,
        temperature=1.0, top_p=1.0, overlong="mask", problems=[], prompt_ids=[], sample_ids=[],
        attempt="a1",
    )  # fmt: skip
    events: list[str] = []

    def fake_generate_and_score(got: PromptRequest, **kwargs: object) -> ScoredChunk:
        assert got == req and set(kwargs) == {"generate_fn", "decode", "score", "worker", "encode"}
        events.append("generate_and_score")
        return ScoredChunk(3, 1, "w", 5, [], [], [], [], [], [], attempt="a1")

    monkeypatch.setattr(cascade.rollout.scoring, "generate_and_score", fake_generate_and_score)
    monkeypatch.setattr(cascade.transport.redis_streams, "publish", lambda *a, **k: events.append("publish"))
    worker = object.__new__(Worker)
    worker.args = argparse.Namespace(name="w", fault_hold_s=0.0, fault_at="before_generate")
    worker.faulted = False
    worker.redis = None
    worker.redis_outage = Dependency("redis", give_up_after_s=0.0, transient=(ConnectionError,), log=print)
    worker.keys = cascade.transport.redis_streams.StreamKeys("test")
    worker.requests = argparse.Namespace(ack=lambda mid: events.append(f"ack {mid}"))
    worker.handle("1-0", req.to_json())
    assert events == ["generate_and_score", "publish", "ack 1-0"]


def test_run_record_masks_the_password_and_the_hint_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    url = "postgresql+psycopg://cascade:s3cret@db.example:5432/cascade"
    assert public_db_url(url) == "postgresql+psycopg://cascade:***@db.example:5432/cascade"
    assert (
        public_db_url("postgresql+psycopg://postgres@127.0.0.1/x")
        == "postgresql+psycopg://postgres@127.0.0.1/x"
    )
    record = RunRecord(
        config={}, distill=True, kind="distributed", db_url=public_db_url(url), cascade_id=7, sources={}
    )
    write_record(run_dir, record)
    assert "s3cret" not in (run_dir / "run.json").read_text()
    back = read_record(run_dir)
    assert back == record and not back.db_url_complete
    hint = resume_command("c.yaml", run_dir, back, embedded=False)
    assert hint.startswith(f"cascade up c.yaml --resume --run-dir {run_dir} --db ")
    assert "--cascade-id 7" in hint and "password" in hint
    own = RunRecord(
        config={},
        distill=True,
        kind="embedded",
        db_url=f"sqlite:///{(run_dir / 'cascade.db').resolve()}",
        cascade_id=1,
        sources={},
    )
    assert (
        resume_command("c.yaml", run_dir, own, embedded=True)
        == f"cascade run c.yaml --resume --run-dir {run_dir}"
    )


def test_a_verifier_that_cannot_run_fails_the_run_before_anything_is_written(
    tmp_path: Path, random_tiny_model: Path
) -> None:
    """The loop prepares every verifier first (the code sandbox: `SandboxUnavailable` naming what
    the host lacks), so a run without one fails at its start, not at its code stage."""
    from cascade.domains import make_domain
    from cascade.runner.embedded import embedded_sources
    from cascade.sandbox.pool import SandboxUnavailable

    cfg = load_cascade_config(_config(tmp_path, random_tiny_model))

    class NoSandbox:
        name = "math"

        def __init__(self) -> None:
            self.inner = make_domain(cfg.domains[1])

        def make_problems(self, split: str, n: int, seed: int) -> list:
            return self.inner.make_problems(split, n, seed)

        def score_batch(self, problems: list, completions: list) -> list:
            raise AssertionError("never scored")

        def prepare(self) -> None:
            raise SandboxUnavailable("bubblewrap not found")

    sources, domains = embedded_sources(cfg)
    domains["math"] = NoSandbox()
    runner = CascadeRunner(cfg, sources, run_dir=tmp_path / "run", domains=domains, log=lambda _: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        runner.run()
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "run.json").exists()


def test_a_step_past_the_verifier_failure_bound_fails_the_stage(
    tmp_path: Path, random_tiny_model: Path
) -> None:
    """Every verdict of the first stage is a platform failure (`infra_error`): the step raises
    past `grpo.max_verifier_failure_fraction`, and the loop fails the stage, the run and the
    cascade with the reason in the event log instead of training on noise."""
    from sqlalchemy import select

    from cascade.domains import make_domain
    from cascade.domains.base import INFRA_ERROR, RewardVerdict
    from cascade.runner.embedded import embedded_sources
    from cascade.store import repo
    from cascade.store.db import make_engine, session_scope
    from cascade.store.models import Cascade, Run

    cfg = load_cascade_config(_config(tmp_path, random_tiny_model))

    class BrokenVerifier:
        name = "if"

        def __init__(self) -> None:
            self.inner = make_domain(cfg.domains[0])

        def make_problems(self, split: str, n: int, seed: int) -> list:
            return self.inner.make_problems(split, n, seed)

        def score_batch(self, problems: list, completions: list) -> list:
            return [RewardVerdict(0.0, INFRA_ERROR, "judge unreachable") for _ in problems]

    sources, domains = embedded_sources(cfg)
    broken = BrokenVerifier()
    domains["if"] = broken
    sources.rollouts.domains["if"] = broken  # type: ignore[attr-defined]
    result = CascadeRunner(cfg, sources, run_dir=tmp_path / "run", domains=domains, log=lambda _: None).run()
    assert result.stopped_by == "failed"
    engine = make_engine(f"sqlite:///{tmp_path / 'run' / 'cascade.db'}")
    with session_scope(engine) as s:
        (cascade,) = s.scalars(select(Cascade)).all()
        (run,) = s.scalars(select(Run)).all()
        stages = repo.list_stages(s, cascade_id=cascade.id)
        assert (cascade.status, run.status) == ("failed", "failed")
        assert [st.state for st in stages] == ["failed", "pending"] and stages[0].steps_done == 0
        events = repo.list_events(s, cascade_id=cascade.id)
        failed = [e for e in events if e.to_state == "failed" and e.stage_id is not None]
        assert "judge unreachable" in failed[0].detail["reason"]
    engine.dispose()

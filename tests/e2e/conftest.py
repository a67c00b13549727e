"""Fixtures for end-to-end cascades on the random tiny model: config files, runs, and a plain
snapshot of what a run left in its database (read back through `cascade.store.repo`)."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from stack_probe import REDIS_URL, redis_up

from cascade.config import CascadeConfig, load_cascade_config
from cascade.runner.embedded import RunResult, embedded_runner
from cascade.store import repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Checkpoint, Run
from cascade.up.stack import LocalStack

TIMING_KEYS = (
    "time_rollout_s",
    "time_loss_s",
    "time_update_s",
    "time_step_s",
    "time_wait_s",
    "time_push_s",
    "idle_fraction",
)
"""Wall-clock metrics: the only step metrics that may differ between identical runs."""

DISTRIBUTED_ONLY = {
    "time_push_s",
    "time_push_replica_max_s",
    "time_save_weights_s",
    "time_wait_s",
    "idle_fraction",
    "duplicate_chunks",
    "rollout_replicas",
    "replicas_out",
    "replica_failures",
    "reissued_requests",
}
"""Step metrics only a distributed run records (its pushes, replicas and re-deliveries)."""
DISTRIBUTED_ONLY_PREFIXES = (
    "resilience/redis_",
    "resilience/teacher_",
    "resilience/rollout_",
    "resilience/reward_",
)
"""The services' outages (`services.learner.sources`): the embedded run has none of them."""


@pytest.fixture(autouse=True, scope="module")
def _e2e_torch_one_thread(torch_one_thread: None) -> Iterator[None]:
    yield


def base_config(model_path: Path, output_dir: Path) -> dict[str, Any]:
    """if -> math, tiny everything; stage 2 distils from `if` with sampled tokens."""
    grpo = {"group_size": 4, "prompts_per_step": 4, "budget": {"max_new_tokens": 16}}
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 64, "n_eval": 16}
    return {
        "name": "e2e",
        "seed": 0,
        "model": {"path": str(model_path)},
        "domains": [
            {"name": "if", "prompts": dict(prompts)},
            {"name": "math", "prompts": dict(prompts)},
        ],
        "stages": [
            {
                "domain": "if",
                "grpo": copy.deepcopy(grpo),
                "advance": {"max_steps": 4},
                "eval": {"every": 2},
            },
            {
                "domain": "math",
                "grpo": copy.deepcopy(grpo),
                "distill": {"loss": "sampled", "prompts_per_teacher": 4},
                "advance": {"max_steps": 4},
                "eval": {"every": 2},
            },
        ],
        "checkpoint": {"every": 2, "keep_last": 2},
        "output_dir": str(output_dir),
    }


def write_config(data: dict[str, Any], path: Path) -> CascadeConfig:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_cascade_config(path)


@dataclass
class Logged:
    result: RunResult
    lines: list[str]


def run_cascade(cfg: CascadeConfig, run_dir: Path | None = None, **kwargs: Any) -> Logged:
    lines: list[str] = []
    runner = embedded_runner(cfg, run_dir=run_dir or cfg.output_dir / cfg.name, log=lines.append, **kwargs)
    return Logged(runner.run(), lines)


@dataclass
class RunRows:
    """What one run left in the store, as plain data."""

    run_status: str
    distill: bool
    stages: list[tuple[int, str, str, str]]  # (index, label, domain, state)
    steps: list[tuple[int, int, int, dict[str, Any]]]  # (stage index, step, global step, metrics)
    evals: list[tuple[int, int, int, str, float, int, dict[str, int]]]
    teachers: list[tuple[str, int, str]]  # (domain, global step, path) of is_teacher rows
    teacher_candidates: list[tuple[str, int]]  # every kind="teacher" checkpoint (domain, global step)
    resume_checkpoints: list[int]  # global steps of kind="resume" rows
    events: list[tuple[str, str | None, str | None, str]] = field(default_factory=list)
    eval_metrics: list[dict[str, Any]] = field(default_factory=list)
    """Each eval's metrics with their intervals, aligned with `evals`."""

    def step_metrics(self, stage: int) -> list[dict[str, Any]]:
        return [m for s, _, _, m in self.steps if s == stage]

    def without_timing(self) -> list[tuple[int, int, int, dict[str, Any]]]:
        return [
            (s, st, g, {k: v for k, v in m.items() if k not in TIMING_KEYS}) for s, st, g, m in self.steps
        ]


def read_rows(db_url: str) -> RunRows:
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            runs = list(s.scalars(select(Run)))
            assert len(runs) == 1, f"expected one run in the store, found {len(runs)}"
            run = runs[0]
            history = repo.load_history(s, run.id)
            ckpts = list(
                s.scalars(select(Checkpoint).where(Checkpoint.run_id == run.id).order_by(Checkpoint.id))
            )
            by_teacher = repo.teachers(s, run_id=run.id)
            teacher_rows = [c for c in ckpts if c.is_teacher]
            assert len(teacher_rows) == len(by_teacher)
            events = repo.list_events(s, cascade_id=run.cascade_id)
            return RunRows(
                run_status=run.status,
                distill=run.distill,
                stages=[(st.index, st.label, st.domain, st.state) for st in history.stages],
                steps=[(p.stage_index, p.step, p.global_step, p.metrics) for p in history.steps],
                evals=[
                    (e.stage_index, e.step, e.global_step, e.domain, e.score, e.n, e.reasons)
                    for e in history.evals
                ],
                teachers=sorted((c.domain or "", c.global_step, c.path) for c in teacher_rows),
                teacher_candidates=[(c.domain or "", c.global_step) for c in ckpts if c.kind == "teacher"],
                resume_checkpoints=[c.global_step for c in ckpts if c.kind == "resume"],
                events=[(e.kind, e.from_state, e.to_state, e.actor) for e in events],
                eval_metrics=[e.metrics for e in history.evals],
            )
    finally:
        engine.dispose()


def comparable_keys(metrics: dict[str, Any], skip: set[str]) -> set[str]:
    """A distributed step's metric names an embedded run also records (less `skip`)."""
    return {k for k in set(metrics) - skip if not k.startswith(DISTRIBUTED_ONLY_PREFIXES)}


def assert_equal_runs(rows: RunRows, ref: RunRows) -> None:
    """A distributed run equal to the embedded one: every step metric but timings and the
    distributed-only ones, and every eval, identical (same seeds, weights and functions)."""
    skip = set(TIMING_KEYS) | DISTRIBUTED_ONLY
    assert len(rows.steps) == len(ref.steps)
    for (_, _, g, dist), (_, _, g2, emb) in zip(rows.steps, ref.steps, strict=True):
        assert g == g2
        assert comparable_keys(dist, skip) == set(emb) - skip, g
        for key in set(emb) - skip:
            a, b = dist[key], emb[key]
            assert a == b, (g, key, a, b)
    assert [e[:5] for e in rows.evals] == [e[:5] for e in ref.evals]
    assert rows.eval_metrics == ref.eval_metrics  # sampled eval metrics and intervals too


def sqlite_url(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / 'cascade.db').resolve()}"


class E2E:
    """The helpers above, handed to tests as the session fixture `e2e` (conftest modules are
    not importable from tests)."""

    TIMING_KEYS = TIMING_KEYS
    DISTRIBUTED_ONLY = DISTRIBUTED_ONLY

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path

    def config(self, directory: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> CascadeConfig:
        """The base config, optionally edited in place by `edit`, written to `directory` and loaded."""
        data = base_config(self.model_path, directory / "runs")
        if edit is not None:
            edit(data)
        return write_config(data, directory / "cascade.yaml")

    run = staticmethod(run_cascade)
    rows = staticmethod(read_rows)
    comparable_keys = staticmethod(comparable_keys)
    assert_equal_runs = staticmethod(assert_equal_runs)
    sqlite_url = staticmethod(sqlite_url)


@pytest.fixture(scope="session")
def full_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a random policy with the `full` spec's tokenizer and size, a tiny trained reward model):
    the five-domain cascades' models."""
    import dataclasses

    from cascade.bootstrap.policy import FULL_SPEC, save_untrained_model
    from cascade.bootstrap.reward_model import build_tiny_reward_model

    root = tmp_path_factory.mktemp("full-models")
    rm = root / "rm"
    build_tiny_reward_model(rm, steps=20, log=lambda _: None)
    spec = dataclasses.replace(FULL_SPEC, sft_problems=(100,) * 5, val_problems_per_domain=8)
    return save_untrained_model(root / "policy", spec, reward_model=rm), rm


@pytest.fixture(scope="session")
def e2e(random_tiny_model: Path) -> E2E:
    return E2E(random_tiny_model)


TRAINED_TINY = Path(__file__).resolve().parents[2] / "models" / "tiny"


@pytest.fixture(scope="session")
def trained_tiny_model() -> Path:
    """The `models/tiny` that `make demo` builds (the Makefile builds it before the tests; if it
    is missing, this builds it, a few CPU minutes): for tests where learning is the point."""
    if not (TRAINED_TINY / "sft_log.json").exists():
        from cascade.bootstrap.policy import build_tiny_model

        build_tiny_model(TRAINED_TINY)
    return TRAINED_TINY


@pytest.fixture(scope="session")
def tool_calling_model(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random tiny model after 300 SFT steps on "prompt with tools -> first call turn"."""
    import torch

    from cascade.config import ChatConfig
    from cascade.domains.agent import AgentDomain, default_format, prompt_tools
    from cascade.engine.batch import build_batch
    from cascade.engine.logprobs import completion_logits, gather_logprobs
    from cascade.model.chat import encode_prompts
    from cascade.model.loading import load_policy
    from cascade.tools.template import ToolCallText

    out = tmp_path_factory.mktemp("tool-calling-tiny") / "model"
    shutil.copytree(random_tiny_model, out)
    policy = load_policy(out)
    tok, model, fmt = policy.tokenizer, policy.model, default_format()
    problems = AgentDomain().make_problems("train", 64, seed=0)
    prompts = encode_prompts(
        tok, ChatConfig(), [p.prompt for p in problems], False, [prompt_tools(p) for p in problems]
    )
    firsts = []
    for p in problems:
        calls = [
            ToolCallText(c["function"]["name"], c["function"]["arguments"])
            for c in p.meta["trace"][0]["tool_calls"]
        ]
        text = fmt.render_calls(calls) + tok.eos_token
        firsts.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    torch.manual_seed(0)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    rng = Random(0)
    for _ in range(300):
        rows = rng.sample(range(len(problems)), 8)
        batch = build_batch([prompts[i] for i in rows], [firsts[i] for i in rows], policy.pad_token_id)
        logp = gather_logprobs(completion_logits(model, batch), batch.completion_ids)
        loss = -(logp * batch.completion_mask).sum() / batch.completion_mask.sum()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def agent_stack(tool_calling_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The services of a distributed run on the tool-calling model (rollout, reward, teacher),
    each test starting its own workers and learner; skipped without Redis."""
    if not redis_up():
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    root = tmp_path_factory.mktemp("agent-distributed")
    s = LocalStack(
        config=root / "unset.yaml",
        model=tool_calling_model,
        run_dir=root / "unset",
        log_dir=root / "logs",
        redis_url=REDIS_URL,
        celery_workers=0,
        claim_idle_ms=60_000,
    )
    try:
        s.start_services(timeout_s=120)
        yield s
    finally:
        s.stop()

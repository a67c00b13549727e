"""A cascade agent -> math: the math stage distils from the agent teacher on the agent's replay
prompts, and the student's distillation samples there are whole episodes (tool calls run,
responses appended), only the student's tokens distilled; embedded and distributed the same
numbers on a seed.

The model is the tool-calling tiny model of `test_agent_turns.py` (the random tiny model tuned
to open with a tool call), so the replay episodes go round the turn loop. The distillation
metrics show it: `distill_agent_model_tokens_mean` below `distill_agent_completion_tokens_mean`
(the environment's tokens were in the samples, not in the loss: `distill_agent_n_tokens`
counts the model's alone). Needs Redis on 127.0.0.1:6379 for the distributed half.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cascade.up.stack import LocalStack

AGENT_STEPS, MATH_STEPS = 1, 2


def _agent_then_math(data: dict[str, Any]) -> None:
    data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 16, "n_eval": 2}
    data["domains"] = [
        {"name": "agent", "prompts": dict(prompts), "reward": {"kind": "agent", "max_turns": 3}},
        {"name": "math", "prompts": dict(prompts)},
    ]
    # the math stage's budget is its distillation samples' too: room for a call, the tool's
    # response and a second turn on the agent's replay prompts
    grpo = {"group_size": 2, "prompts_per_step": 2, "budget": {"max_new_tokens": 120}}
    data["stages"] = [
        {
            "domain": "agent",
            "grpo": dict(grpo),
            "advance": {"max_steps": AGENT_STEPS},
            "eval": {"every": AGENT_STEPS},
        },
        {
            "domain": "math",
            "grpo": grpo | {"budget": {"max_new_tokens": 160}},
            "distill": {"loss": "sampled", "prompts_per_teacher": 2, "samples_per_prompt": 2},
            "advance": {"max_steps": MATH_STEPS},
            "eval": {"every": MATH_STEPS},
        },
    ]


@pytest.fixture(scope="module")
def embedded(e2e: Any, tool_calling_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("agent-distill-embedded")
    runs = type(e2e)(tool_calling_model)
    cfg = runs.config(root, _agent_then_math)
    runs.run(cfg, run_dir=root / "run")
    return runs.rows(runs.sqlite_url(root / "run"))


def test_math_stage_distils_whole_agent_episodes(embedded: Any) -> None:
    assert embedded.run_status == "completed"
    math = embedded.step_metrics(1)
    assert len(math) == MATH_STEPS
    assert ("agent", AGENT_STEPS) in [(d, g) for d, g, _ in embedded.teachers]
    for m in math:
        assert m["distill_agent_n_tokens"] > 0 and m["distill_agent_turns_per_episode"] >= 1.0
        # the distilled tokens are the model's: the loss counts model_tokens_mean per sample
        assert m["distill_agent_n_tokens"] == pytest.approx(4 * m["distill_agent_model_tokens_mean"])
    # episodes went round the loop: calls made, the environment's tokens in the samples
    attempts = [
        m["distill_agent_calls_per_episode"] + m["distill_agent_malformed_calls_per_episode"] for m in math
    ]
    assert sum(attempts) > 0
    assert any(m["distill_agent_model_tokens_mean"] < m["distill_agent_completion_tokens_mean"] for m in math)
    assert any(m["distill_agent_turns_per_episode"] > 1.0 for m in math)


def test_agent_distillation_distributed_equals_embedded(
    embedded: Any, agent_stack: LocalStack, e2e: Any, tool_calling_model: Path, tmp_path: Path
) -> None:
    stack = agent_stack
    runs = type(e2e)(tool_calling_model)
    runs.config(tmp_path, _agent_then_math)
    stack.config, stack.run_dir, stack.db = tmp_path / "cascade.yaml", tmp_path / "distributed", None
    stack.stream_prefix = f"cascade:test:{uuid.uuid4().hex[:8]}"
    try:
        for i in range(2):
            stack.worker(i)
        stack.start_learner()
        assert stack.wait(timeout_s=300) == 0, stack.procs["learner"].log()[-3000:]
    finally:
        stack.stop_run()
    rows = runs.rows(runs.sqlite_url(tmp_path / "distributed"))
    assert rows.run_status == "completed"
    assert len(rows.steps) == len(embedded.steps) == AGENT_STEPS + MATH_STEPS
    skip = set(e2e.TIMING_KEYS) | e2e.DISTRIBUTED_ONLY
    for (_, _, g, dist), (_, _, g2, emb) in zip(rows.steps, embedded.steps, strict=True):
        assert g == g2
        keys = {k for k in set(emb) - skip if not k.startswith("resilience/")}
        assert {k for k in set(dist) - skip if not k.startswith("resilience/")} == keys
        for key in keys:
            assert dist[key] == emb[key], (g, key, dist[key], emb[key])
    assert any(k.startswith("distill_agent_") for k in rows.step_metrics(1)[0])
    assert [e[:5] for e in rows.evals] == [e[:5] for e in embedded.evals]
    assert rows.eval_metrics == embedded.eval_metrics

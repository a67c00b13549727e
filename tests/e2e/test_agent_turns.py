"""An agent stage, multi-turn, embedded and distributed: the same numbers on a seed.

The model is the random tiny model tuned for a few seconds to open its answer with a tool call
(the first turn of the agent tasks' reference traces), so the episodes really go round the turn
loop: calls run, responses appended, later turns generated on the longer context, in the
embedded run (the policy in this process) and through the rollout workers (rollout service,
reward service, Redis). The learner trains only the model's tokens (`model_tokens_mean` below
the completion's length shows the environment's tokens were there and were left out).
Needs Redis on 127.0.0.1:6379 (skipped without it).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from random import Random
from typing import Any

import pytest
from stack_probe import REDIS_URL, redis_up

from cascade.up import LocalStack

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


@pytest.fixture(scope="module")
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


def _agent_stage(data: dict[str, Any]) -> None:
    data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
    data["domains"] = [
        {
            "name": "agent",
            "prompts": {"kind": "synthetic", "seed": 0, "n_train": 32, "n_eval": 4},
            "reward": {"kind": "agent", "max_turns": 3},
        }
    ]
    data["stages"] = [
        {
            "domain": "agent",
            "grpo": {"group_size": 4, "prompts_per_step": 4, "budget": {"max_new_tokens": 120}},
            "advance": {"max_steps": 2},
            "eval": {"every": 2},
        }
    ]


@pytest.fixture(scope="module")
def stack(tool_calling_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
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


def test_agent_stage_multi_turn_distributed_equals_embedded(
    stack: LocalStack, e2e: Any, tool_calling_model: Path, tmp_path: Path
) -> None:
    runs = type(e2e)(tool_calling_model)
    cfg = runs.config(tmp_path / "embedded", _agent_stage)
    runs.run(cfg, run_dir=tmp_path / "embedded" / "run")
    ref = runs.rows(runs.sqlite_url(tmp_path / "embedded" / "run"))

    runs.config(tmp_path, _agent_stage)
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
    assert rows.run_status == "completed" and len(rows.steps) == len(ref.steps) == 2

    # the episodes went round the loop: calls were made and answered, and the environment's
    # tokens were in the completions but not among the model's
    assert all(m["turns/turns_per_episode"] >= 1.0 for _, _, _, m in ref.steps)
    assert (
        sum(m["turns/calls_per_episode"] + m["turns/malformed_calls_per_episode"] for _, _, _, m in ref.steps)
        > 0
    )
    assert any(m["model_tokens_mean"] < m["completion_tokens_mean"] for _, _, _, m in ref.steps)
    skip = set(e2e.TIMING_KEYS) | DISTRIBUTED_ONLY
    for (_, _, g, dist), (_, _, g2, emb) in zip(rows.steps, ref.steps, strict=True):
        assert g == g2
        keys = {k for k in set(emb) - skip if not k.startswith("resilience/")}
        assert {k for k in set(dist) - skip if not k.startswith("resilience/")} == keys
        for key in keys:
            assert dist[key] == emb[key], (g, key, dist[key], emb[key])
    assert [e[:5] for e in rows.evals] == [e[:5] for e in ref.evals]
    assert rows.eval_metrics == ref.eval_metrics

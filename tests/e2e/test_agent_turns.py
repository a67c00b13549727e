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

import uuid
from pathlib import Path
from typing import Any

from cascade.up.stack import LocalStack


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


def test_agent_stage_multi_turn_distributed_equals_embedded(
    agent_stack: LocalStack, e2e: Any, tool_calling_model: Path, tmp_path: Path
) -> None:
    stack = agent_stack
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
    skip = set(e2e.TIMING_KEYS) | e2e.DISTRIBUTED_ONLY
    for (_, _, g, dist), (_, _, g2, emb) in zip(rows.steps, ref.steps, strict=True):
        assert g == g2
        keys = {k for k in set(emb) - skip if not k.startswith("resilience/")}
        assert {k for k in set(dist) - skip if not k.startswith("resilience/")} == keys
        for key in keys:
            assert dist[key] == emb[key], (g, key, dist[key], emb[key])
    assert [e[:5] for e in rows.evals] == [e[:5] for e in ref.evals]
    assert rows.eval_metrics == ref.eval_metrics

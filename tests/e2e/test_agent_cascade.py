"""`examples/agent-cascade.yaml` (math -> code -> agent), shortened, embedded, on a random model
of the `agent` spec (its tokenizer: single-token tool markers): every stage runs in the recipe's
order, the agent stage's rollouts are multi-turn episodes that distil from the math and code
teachers, and the agent eval reports task success (Wilson), calls per task and the tool-error
rate (bootstrap) in the store, as the API and the trackers read them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.bootstrap.policy import AGENT_DOMAINS, AGENT_SPEC, save_untrained_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent-cascade.yaml"
STAGE_STEPS = 2


@pytest.fixture(scope="module")
def agent_run(e2e, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("agent-cascade")
    spec = dataclasses.replace(AGENT_SPEC, sft_problems_per_domain=200, val_problems_per_domain=4)
    policy = save_untrained_model(root / "policy", spec)
    example = yaml.safe_load(EXAMPLE.read_text())

    def edit(data: dict[str, Any]) -> None:
        data["name"] = "e2e-agent"
        data["model"]["path"] = str(policy)
        data["domains"] = example["domains"]
        for d in data["domains"]:
            d["prompts"] |= {"n_train": 16, "n_eval": 4}
        stages = example["stages"]
        for stage in stages:
            stage["grpo"] |= {"group_size": 2, "prompts_per_step": 2, "warmup_steps": 1}
            stage["grpo"]["budget"] = {"max_new_tokens": 48 if stage["domain"] == "agent" else 12}
            stage["filter"] = {"prompt_filter": False}
            stage["advance"] = {"max_steps": STAGE_STEPS}
            stage["eval"] = {"every": STAGE_STEPS, "max_new_tokens": 48}
            if "distill" in stage:
                stage["distill"] |= {"prompts_per_teacher": 2, "lam": {"kind": "constant", "value": 1.0}}
        data["stages"] = stages

    cfg = e2e.config(root, edit)
    logged = e2e.run(cfg)
    return {
        "result": logged.result,
        "log": logged.lines,
        "rows": e2e.rows(e2e.sqlite_url(cfg.output_dir / cfg.name)),
    }


def test_the_recipe_order_runs_to_completion(agent_run: dict[str, Any]) -> None:
    rows = agent_run["rows"]
    assert agent_run["result"].stopped_by == "completed"
    assert [(i, d, st) for i, _, d, st in rows.stages] == [
        (i, d, "completed") for i, d in enumerate(AGENT_DOMAINS)
    ]


def test_agent_stage_is_multi_turn_and_distils_from_math_and_code(agent_run: dict[str, Any]) -> None:
    rows = agent_run["rows"]
    agent_steps = rows.step_metrics(AGENT_DOMAINS.index("agent"))
    assert len(agent_steps) == STAGE_STEPS
    for metrics in agent_steps:
        assert metrics["distill_math_n_tokens"] > 0 and metrics["distill_code_n_tokens"] > 0
        assert "turns/turns_per_episode" in metrics and metrics["turns/turns_per_episode"] >= 1.0


def test_agent_eval_has_success_calls_and_tool_errors(agent_run: dict[str, Any]) -> None:
    rows = agent_run["rows"]
    agent = [m for e, m in zip(rows.evals, rows.eval_metrics, strict=True) if e[3] == "agent"]
    assert agent, "no agent eval recorded"
    for metrics in agent:
        success = metrics["greedy"]
        assert success["method"] == "wilson" and success["low"] <= success["value"] <= success["high"]
        for name in ("calls_per_task", "tool_error_rate"):
            m = metrics[name]
            # bootstrap over tasks (a calls count that is 0/1 in every task is a proportion: Wilson)
            assert m["n"] == 4 and m["method"] in ("bootstrap", "wilson"), (name, m)
            assert m["low"] <= m["value"] <= m["high"] or m["value"] == 0.0
    others = [m for e, m in zip(rows.evals, rows.eval_metrics, strict=True) if e[3] != "agent"]
    assert others and all("calls_per_task" not in m for m in others)

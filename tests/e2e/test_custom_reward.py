"""A user's own reward function and two data sets of one verifier kind, end to end on the random
tiny model, embedded and distributed (examples/custom-reward.yaml, shortened): `math` (synthetic),
`gsm8k` (the GSM8K parquet fixture scored by examples/custom_reward/gsm8k_reward.py) and
`gsm8k-math` (the same rows, `verifier: math`) each train a stage and are each a row of the evals.
Distributed, the rollout workers' verdicts come from the reward service, which `cascade up`'s
stack starts with `--python-reward` for the config's function."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from stack_probe import REDIS_URL, redis_up

from cascade.runner.step_logs import COMPLETIONS_LOG
from cascade.up.stack import LocalStack

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "data" / "hf" / "gsm8k"
DOMAINS = ["math", "gsm8k", "gsm8k-math"]
FUNCTION_REASONS = {"ok", "wrong_answer", "no_answer"}


def _custom(data: dict[str, Any]) -> None:
    data["name"] = "custom-reward"
    gsm8k = {
        "kind": "hf",
        "adapter": "gsm8k",
        "data_files": {"train": [str(GSM8K / "train.parquet")], "test": [str(GSM8K / "test.parquet")]},
        "eval_split": "test",
        "n_eval": 2,
        "instruction": "Put the final answer in \\boxed{}.",
    }
    reward = {
        "kind": "python",
        "function": "gsm8k_reward:score",
        "python_path": [str(REPO / "examples" / "custom_reward")],
        "options": {"box_bonus": 0.1},
        "time_limit_s": 5,
    }
    data["domains"] = [
        {"name": "math", "prompts": {"kind": "synthetic", "seed": 0, "n_train": 16, "n_eval": 2}},
        {"name": "gsm8k", "prompts": gsm8k, "reward": reward},
        {"name": "gsm8k-math", "verifier": "math", "prompts": gsm8k},
    ]
    grpo = {"group_size": 2, "prompts_per_step": 2, "budget": {"max_new_tokens": 12}}
    data["stages"] = [
        {"domain": d, "grpo": dict(grpo), "advance": {"max_steps": 2}, "eval": {"every": 2}} for d in DOMAINS
    ]
    data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}


def _check(e2e: Any, db_url: str, run_dir: Path) -> None:
    rows = e2e.rows(db_url)
    assert rows.run_status == "completed"
    assert [(d, st) for _, _, d, st in rows.stages] == [(d, "completed") for d in DOMAINS]
    assert {e[3] for e in rows.evals} == set(DOMAINS)  # three rows of the regression table
    gsm8k_steps = rows.step_metrics(1)
    assert len(gsm8k_steps) == 2
    for metrics in gsm8k_steps:  # every verdict of the stage is the function's (none failed)
        assert set(metrics["reasons"]) <= FUNCTION_REASONS, metrics["reasons"]
    records = [json.loads(line) for line in (run_dir / COMPLETIONS_LOG).read_text().splitlines()]
    judged = [r for r in records if r["domain"] == "gsm8k"]
    assert judged and all(
        r["detail"] == "no number in the response" or " vs " in r["detail"] for r in judged
    ), judged


def test_embedded(e2e: Any, tmp_path: Path) -> None:
    cfg = e2e.config(tmp_path, _custom)
    run_dir = tmp_path / "run"
    logged = e2e.run(cfg, run_dir=run_dir)
    assert logged.result.stopped_by == "completed"
    _check(e2e, e2e.sqlite_url(run_dir), run_dir)


@pytest.mark.postgres
def test_distributed(e2e: Any, tmp_path: Path, random_tiny_model: Path, postgres_url: str) -> None:
    if not redis_up():
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    e2e.config(tmp_path, _custom)
    run_dir = tmp_path / "distributed"
    stack = LocalStack(
        config=tmp_path / "cascade.yaml",  # read when the services start: the reward's --python-reward
        model=random_tiny_model,
        run_dir=run_dir,
        log_dir=tmp_path / "logs",
        redis_url=REDIS_URL,
        celery_workers=0,
        db=postgres_url,
    )
    stack.stream_prefix = f"cascade:test:{uuid.uuid4().hex[:8]}"
    try:
        stack.start_services(timeout_s=120)
        assert "--python-reward" in stack.procs["reward"].argv
        stack.worker(0)
        stack.start_learner()
        assert stack.wait(timeout_s=300) == 0, stack.procs["learner"].log()[-3000:]
    finally:
        stack.stop()
    _check(e2e, postgres_url, run_dir)

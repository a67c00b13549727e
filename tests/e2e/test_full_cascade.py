"""The five-domain cascade (rlhf -> if -> math -> code -> swe, as `examples/full-cascade.yaml`)
on a random tiny model built with the `full` spec and a tiny reward model trained in the test:
2 steps per stage. Checks the plumbing the demo relies on: every stage runs, each finished
domain gets a teacher, later stages distil from all earlier domains, rlhf and swe rewards and
evals stay in their ranges, and the report has a row per domain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cascade.bootstrap.policy import FULL_DOMAINS

STAGE_STEPS = 2


@pytest.fixture(scope="module")
def full_run(e2e, full_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    policy, rm = full_models
    directory = tmp_path_factory.mktemp("full")
    budgets = {"rlhf": 12, "if": 8, "math": 8, "code": 8, "swe": 16}

    def edit(data: dict[str, Any]) -> None:
        data["name"] = "e2e-full"
        data["model"]["path"] = str(policy)
        prompts = {"kind": "synthetic", "seed": 0, "n_train": 32, "n_eval": 4}
        data["domains"] = [{"name": d, "prompts": dict(prompts)} for d in FULL_DOMAINS]
        data["domains"][0]["reward"] = {"kind": "rlhf", "model_path": str(rm), "baseline": "reference"}
        data["stages"] = [
            {
                "domain": d,
                "grpo": {"group_size": 2, "prompts_per_step": 2, "budget": {"max_new_tokens": budgets[d]}},
                "filter": {"prompt_filter": False},
                "distill": {"loss": "sampled", "prompts_per_teacher": 2},
                "advance": {"max_steps": STAGE_STEPS},
                "eval": {"every": STAGE_STEPS, "max_new_tokens": 16},
            }
            for d in FULL_DOMAINS
        ]

    cfg = e2e.config(directory, edit)
    logged = e2e.run(cfg)
    run_dir = cfg.output_dir / cfg.name
    return {"result": logged.result, "log": logged.lines, "rows": e2e.rows(e2e.sqlite_url(run_dir))}


def test_every_stage_ran_in_the_papers_order(full_run: dict[str, Any]) -> None:
    rows = full_run["rows"]
    assert full_run["result"].stopped_by == "completed"
    assert rows.stages == [(i, d, d, "completed") for i, d in enumerate(FULL_DOMAINS)]
    expected = [(i, s) for i in range(len(FULL_DOMAINS)) for s in range(1, STAGE_STEPS + 1)]
    assert [(stage, step) for stage, step, _, _ in rows.steps] == expected


def test_teachers_registered_and_used(full_run: dict[str, Any]) -> None:
    rows = full_run["rows"]
    assert sorted(d for d, _, _ in rows.teachers) == sorted(FULL_DOMAINS)
    for i, domain in enumerate(FULL_DOMAINS):
        earlier = list(FULL_DOMAINS[:i])
        line = f"stage {i + 1}/{len(FULL_DOMAINS)} '{domain}' ({domain}), teachers: {earlier or 'none'}"
        assert any(line in entry for entry in full_run["log"]), line
        for metrics in rows.step_metrics(i):
            for teacher in earlier:
                assert metrics[f"distill_{teacher}_n_tokens"] > 0
            assert ("loss_distill" in metrics) == bool(earlier)


def test_rewards_and_evals_in_range(full_run: dict[str, Any]) -> None:
    rows = full_run["rows"]
    for stage, domain in enumerate(FULL_DOMAINS):
        for metrics in rows.step_metrics(stage):
            low = -1.0 if domain == "swe" else 0.0
            assert low <= metrics["reward_mean"] <= 1.0, (domain, metrics["reward_mean"])
            assert "infra_error" not in metrics["reasons"], (domain, metrics["reasons"])
    evaluated = {d for _, _, _, d, *_ in rows.evals}
    assert evaluated == set(FULL_DOMAINS)
    for _, _, _, domain, score, n, reasons in rows.evals:
        assert n == 4 and "infra_error" not in reasons
        # rlhf: win probability against the reference answer; swe: patch reward in [-1, 1].
        assert (-1.0 if domain == "swe" else 0.0) <= score <= 1.0, (domain, score)


def test_report_has_a_row_per_domain(full_run: dict[str, Any]) -> None:
    table = json.loads((full_run["result"].report_dir / "regression_table.json").read_text())
    assert [r["domain"] for r in table["rows"]] == list(FULL_DOMAINS)
    assert list(table["stages"]) == list(FULL_DOMAINS)

"""Learning is the point here: GRPO on the trained tiny model must raise its own domain.

Uses the same `models/tiny` that `make demo` builds (the Makefile builds it before the tests;
if it is missing, the fixture builds it, a few CPU minutes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cascade.config import load_cascade_config
from cascade.runner.embedded import embedded_runner
from cascade.store import repo
from cascade.store.db import make_engine, session_scope

pytestmark = pytest.mark.slow
STEPS = 100


def _learning_config(model: Path, out: Path, *, thinking: bool) -> Path:
    """One math GRPO stage of `STEPS` steps on the trained tiny model (thinking mode: the model
    writes its reasoning block itself, so the budget leaves room for it)."""
    grpo = {
        "group_size": 8,
        "prompts_per_step": 16,
        "learning_rate": 2.0e-4,
        "warmup_steps": 5,
        "budget": {"max_new_tokens": 32 if thinking else 24},
    }
    if thinking:
        grpo["thinking"] = True
    cfg = {
        "name": "learning-thinking" if thinking else "learning",
        "seed": 0,
        "model": {"path": str(model)},
        "domains": [{"name": "math", "prompts": {"kind": "synthetic", "n_train": 2000, "n_eval": 256}}],
        "stages": [
            {
                "domain": "math",
                "grpo": grpo,
                "filter": {"prompt_filter": True},
                "advance": {"max_steps": STEPS, "threshold": 1.0},
                "eval": {"every": STEPS},
            }
        ],
        "checkpoint": {"every": STEPS},
        "output_dir": str(out / "runs"),
    }
    path = out / "learning.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _trained(path: Path, run_dir: Path) -> tuple[list[float], list[float]]:
    """Run the stage; its training rewards per step and its math evals."""
    result = embedded_runner(load_cascade_config(path), run_dir=run_dir, log=lambda _: None).run()
    assert result.finished
    engine = make_engine(f"sqlite:///{run_dir / 'cascade.db'}")
    with session_scope(engine) as s:
        history = repo.load_history(s, 1)
    rewards = [p.metrics["reward_mean"] for p in history.steps]
    assert len(rewards) == STEPS
    return rewards, [e.score for e in history.evals if e.domain == "math"]


def test_grpo_raises_math_on_the_trained_tiny_model(trained_tiny_model: Path, tmp_path: Path) -> None:
    path = _learning_config(trained_tiny_model, tmp_path, thinking=False)
    rewards, evals = _trained(path, tmp_path / "run")
    early, late = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    print(f"training reward {early:.3f} -> {late:.3f}; math eval {evals}")
    # Measured here: training reward 0.161 -> 0.243 over 100 steps (2560 samples per side: the
    # +0.04 bar is about 5 standard errors), math eval 14.5% -> 15.6%. The greedy eval lags the
    # sampled reward on this model (the demo's math eval reaches 22% only at step 140), and the
    # model itself differs between CPU types (float kernels), so the eval is held to "did not
    # fall" and the reward to "rose". A sign error in the loss makes the reward fall.
    assert late >= early + 0.04, (early, late)
    assert evals[-1] >= evals[0] - 0.03, evals
    table = json.loads((tmp_path / "run" / "report" / "regression_table.json").read_text())
    assert table["rows"][0]["domain"] == "math"


def test_grpo_in_thinking_mode_raises_math_on_the_trained_tiny_model(
    trained_tiny_model: Path, tmp_path: Path
) -> None:
    """The same stage with `thinking: true`: the model writes its reasoning block itself and the
    verifier judges what follows `</think>` (split on the sampled markers, issue 33). Measured
    here: training reward 0.157 -> 0.344 over 100 steps, math eval (greedy, thinking) 12.5% ->
    28.9% (73 s). The distributed run of thinking mode equals the embedded one metric for metric
    (tests/e2e/test_distributed.py, stage 2 of `_two_stage`)."""
    path = _learning_config(trained_tiny_model, tmp_path, thinking=True)
    rewards, evals = _trained(path, tmp_path / "run")
    early, late = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    print(f"thinking mode: training reward {early:.3f} -> {late:.3f}; math eval {evals}")
    assert late >= early + 0.08, (early, late)
    assert evals[-1] >= evals[0] + 0.05, evals

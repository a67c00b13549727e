"""The regression gate on the trained tiny model, with a scripted regression: math trains a step
(its best checkpoint, with its interval), then the code stage's first step is followed by noise
added to every weight, which drops math far outside its eval's noise. With the gate, the stage
does not advance: an MOPD phase distils math from its best checkpoint until an eval finds it back,
and the decision, its evidence and the phase are in the store's events, the steps and the report.
Without the gate, the same run ends with math fallen: the phase is what repaired it. The drift
warning's KL on math's probe shows the regression at the very step it happens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from cascade.eval.stats import outside_noise

NOISE = 0.4
"""Noise per weight, in units of its tensor's mean magnitude: enough to take math to ~0%."""
PHASE_BOUND = 40


def _config(data: dict[str, Any], model: Path, gate: bool) -> None:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 500, "n_eval": 128}
    grpo = {"group_size": 4, "prompts_per_step": 8, "learning_rate": 5e-4, "budget": {"max_new_tokens": 24}}
    data["name"] = "gate"
    data["model"]["path"] = str(model)
    data["chat"] = {"think_flag": "/think", "no_think_flag": "/no_think"}
    data["domains"] = [
        {"name": "math", "prompts": dict(prompts)},
        {"name": "code", "prompts": {**prompts, "n_eval": 8}},
    ]
    data["stages"] = [
        {"domain": "math", "grpo": dict(grpo), "advance": {"max_steps": 1}, "eval": {"every": 1}},
        {
            "domain": "code",
            "grpo": dict(grpo),
            "distill": {"enabled": False},
            "advance": {"max_steps": 1},
            "eval": {"every": 1},
            "gate": {
                "enabled": gate,
                "max_steps": PHASE_BOUND,
                "eval_every": 5,
                "drift_every": 1,
                "drift_prompts": 4,
            },
        },
    ]


def _run(e2e: Any, model: Path, directory: Path, *, gate: bool) -> Any:
    from cascade.runner.embedded import embedded_runner

    cfg = e2e.config(directory, lambda data: _config(data, model, gate))
    lines: list[str] = []
    runner = embedded_runner(cfg, run_dir=directory / "run", log=lines.append)

    def regress(global_step: int, metrics: dict[str, Any]) -> None:
        if global_step == 2:  # the code stage's first step: the scripted regression
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in runner.policy.model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * NOISE * p.abs().mean())

    runner.on_step = regress
    try:
        result = runner.run()
    finally:
        runner.close()
    assert result.stopped_by == "completed", lines[-10:]
    return e2e.rows(e2e.sqlite_url(directory / "run")), lines, directory / "run"


def _math_evals(rows: Any) -> list[tuple[int, float, tuple[float, float]]]:
    out = []
    for e, m in zip(rows.evals, rows.eval_metrics, strict=True):
        if e[3] == "math":
            greedy = m["greedy"]
            out.append((e[2], e[4], (greedy["low"], greedy["high"])))
    return out


@pytest.fixture(scope="module")
def gated(e2e: Any, trained_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _run(e2e, trained_tiny_model, tmp_path_factory.mktemp("gated"), gate=True)


def test_the_gate_catches_the_regression_and_the_phase_repairs_it(gated: Any) -> None:
    rows, lines, _ = gated
    opened = [e for e in rows.events if e[0] == "gate_opened"]
    closed = [e for e in rows.events if e[0] == "gate_closed"]
    assert len(opened) == 1 and len(closed) == 1, rows.events
    assert any("regression gate: math" in line for line in lines), lines
    assert any("regression gate: recovered" in line for line in lines), "\n".join(lines)

    phase = [(g, m) for s, _, g, m in rows.steps if m.get("gate_phase")]
    assert phase and all(s == 1 for s, _, _, m in rows.steps if m.get("gate_phase"))
    assert len(phase) < PHASE_BOUND  # it ended because math was back, not at the bound
    for _, m in phase:  # distillation alone, from math's best checkpoint
        assert m["distill_math_n_tokens"] > 0 and "reward_mean" not in m

    evals = _math_evals(rows)
    best = max(evals, key=lambda e: e[1])
    after_regression = next(e for e in evals if e[0] == 2)
    final = evals[-1]
    assert outside_noise(after_regression[2], best[2]), (after_regression, best)  # the gate's evidence
    assert not outside_noise(final[2], best[2]), (final, best)  # back within noise
    assert final[0] == phase[-1][0]


def test_the_decision_its_evidence_and_the_phase_are_recorded(gated: Any) -> None:
    from sqlalchemy import select

    from cascade.store.db import make_engine, session_scope
    from cascade.store.models import Event

    rows, _, run_dir = gated
    engine = make_engine(f"sqlite:///{run_dir / 'cascade.db'}")
    try:
        with session_scope(engine) as s:
            details = {e.kind: dict(e.detail) for e in s.scalars(select(Event)) if e.kind.startswith("gate_")}
    finally:
        engine.dispose()
    fallen = details["gate_opened"]["fallen"]
    assert [f["domain"] for f in fallen] == ["math"]
    f = fallen[0]
    assert f["now_high"] < f["best_low"]  # the interval test, with both intervals
    assert f["best_step"] == 1 and f["best"] >= f["best_low"]
    assert details["gate_closed"]["outcome"] == "recovered"
    assert details["gate_closed"]["steps"] == sum(1 for *_, m in rows.steps if m.get("gate_phase"))
    table = (run_dir / "report" / "regression_table.md").read_text()
    assert "Regression gate: in stage 'code', an MOPD phase of" in table
    phases = json.loads((run_dir / "report" / "regression_table.json").read_text())["gate_phases"]
    assert [(ph["stage"], ph["steps"]) for ph in phases] == [("code", details["gate_closed"]["steps"])]


def test_the_drift_warning_sees_the_regression_at_once(gated: Any) -> None:
    rows, _, _ = gated
    code_steps = [m for s, _, _, m in rows.steps if s == 1]
    # step 1 is read before the noise (a GRPO step of code: math's drift is small), step 2 after
    before, after = code_steps[0]["drift_kl/math"], code_steps[1]["drift_kl/math"]
    assert before < 0.05 and after > 10 * before, (before, after)
    assert code_steps[-1]["drift_kl/math"] < after / 2  # the phase brings it back toward the start


def test_without_the_gate_math_stays_fallen(e2e: Any, trained_tiny_model: Path, tmp_path: Path) -> None:
    rows, _, _ = _run(e2e, trained_tiny_model, tmp_path, gate=False)
    assert not any(e[0].startswith("gate_") for e in rows.events)
    assert not any(m.get("gate_phase") for _, _, _, m in rows.steps)
    evals = _math_evals(rows)
    best = max(evals, key=lambda e: e[1])
    assert outside_noise(evals[-1][2], best[2]), (evals[-1], best)

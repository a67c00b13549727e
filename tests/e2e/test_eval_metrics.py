"""Sampled eval metrics end to end on the random tiny model, embedded: `eval: {samples: 4,
metrics: [greedy, avg@4, pass@2]}` records every metric with its interval in the store, the
report and the API's reads, and the advance rule watches pass@2 (tests/e2e/test_distributed.py
runs the same eval through the rollout service and asserts the same numbers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cascade.store.db import make_engine, session_scope
from cascade.store.models import Eval, Run
from services.api import queries

METRICS = ["greedy", "avg@4", "pass@2"]


def _sampled_eval(data: dict[str, Any]) -> None:
    for stage in data["stages"]:
        stage["eval"] = {"every": 2, "samples": 4, "metrics": list(METRICS)}
    # threshold 0: the first eval of pass@2 after step 0 advances the stage (min_steps 1)
    data["stages"][0]["advance"] = {
        "max_steps": 4, "min_steps": 1, "metric": "eval/{domain}/pass@2", "threshold": 0.0,
    }  # fmt: skip


@pytest.fixture(scope="module")
def sampled_run(e2e: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("sampled-eval")
    cfg = e2e.config(directory, _sampled_eval)
    logged = e2e.run(cfg)
    run_dir = cfg.output_dir / cfg.name
    return {"cfg": cfg, "result": logged.result, "run_dir": run_dir, "url": e2e.sqlite_url(run_dir)}


def _eval_rows(url: str) -> list[Eval]:
    engine = make_engine(url)
    try:
        with session_scope(engine) as s:
            rows = list(s.scalars(select(Eval).order_by(Eval.global_step, Eval.id)))
            s.expunge_all()
            return rows
    finally:
        engine.dispose()


def test_every_metric_recorded_with_its_interval(sampled_run: dict[str, Any]) -> None:
    rows = _eval_rows(sampled_run["url"])
    assert sorted({(r.global_step, r.domain) for r in rows}) == [
        (g, d) for g in (0, 2, 4, 6) for d in ("if", "math")
    ]
    for r in rows:
        assert r.metrics is not None and list(r.metrics) == METRICS
        greedy = r.metrics["greedy"]
        assert greedy["value"] == r.score  # the primary metric is the score, exactly
        assert greedy["method"] == "wilson" and greedy["n"] == r.n == 16
        assert sum(r.reasons.values()) == 16  # the greedy completions' verdicts
        for name, m in r.metrics.items():
            assert 0.0 <= m["low"] <= m["value"] <= m["high"] <= 1.0, (name, m)
            assert m["method"] in ("wilson", "bootstrap") and m["n"] == 16
        # pass@2 >= pass@1, and avg@4 over all 4 samples is pass@1 (no infra errors here)
        assert r.metrics["pass@2"]["value"] >= r.metrics["avg@4"]["value"] - 1e-12


def test_advance_rule_watches_pass_at_k(sampled_run: dict[str, Any]) -> None:
    engine = make_engine(sampled_run["url"])
    try:
        with session_scope(engine) as s:
            from cascade.store import repo

            history = repo.load_history(s, s.scalars(select(Run)).one().id)
    finally:
        engine.dispose()
    assert [s.state for s in history.stages] == ["completed", "completed"]
    # stage 0 stopped by its threshold on pass@2 at its first eval after step 0 (step 2)
    assert [p.step for p in history.steps if p.stage_index == 0] == [1, 2]
    assert [p.step for p in history.steps if p.stage_index == 1] == [1, 2, 3, 4]


def test_report_and_api_show_intervals(sampled_run: dict[str, Any]) -> None:
    report = Path(sampled_run["result"].report_dir)
    table = json.loads((report / "regression_table.json").read_text())
    for row in table["rows"]:
        for key in ("start", "best", "final"):
            low, high = row[f"{key}_ci"]
            assert low <= row[key] <= high
        assert isinstance(row["drop_outside_noise"], bool)
    assert "[" in (report / "regression_table.md").read_text()
    engine = make_engine(sampled_run["url"])
    try:
        with session_scope(engine) as s:
            run = s.scalars(select(Run)).one()
            evals = queries.evals(s, run.cascade_id, run.id)
            regression = queries.regression(s, run.cascade_id, run.id)
    finally:
        engine.dispose()
    assert len(evals.evals) == 8
    for e in evals.evals:
        assert list(e.metrics) == METRICS
        assert e.low is not None and e.high is not None and e.low <= e.score <= e.high
        assert e.metrics["greedy"].value == e.score
    assert [r.model_dump() for r in regression.rows] == table["rows"]

"""A cascade trained on public data sets stored as parquet in their own schemas (`kind: hf`),
end to end on the random tiny model, embedded: GSM8K math (its train split to train on, its test
split to evaluate), MBPP code (scored in the bubblewrap sandbox; left out where it cannot start)
and IFEval instruction following, the last two holding out rows of their train split. The run
completes, records its steps and its sampled evals (greedy, avg@4, pass@2 with intervals), and
every trained sample is a row of a parquet file, never an eval row. The data are the fixtures of
tests/data/hf; examples/hf-public-data.yaml is the same cascade for the demo model."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from cascade.config import CascadeConfig
from cascade.domains import load_problems
from cascade.domains.base import INFRA_ERROR
from cascade.runner.loop import SAMPLES_LOG

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
METRICS = ["greedy", "avg@4", "pass@2"]
STEPS_PER_STAGE = 2
TEXT_COLUMN = {"gsm8k": "question", "mbpp": "text", "ifeval": "prompt"}
"""The column each adapter builds its prompt from."""


@cache
def _sandbox_runs() -> bool:
    from cascade.sandbox import preflight

    return all(c.ok for c in preflight.check() if c.required)


def _domains() -> list[dict[str, Any]]:
    math = {
        "name": "math",
        "prompts": {
            "kind": "hf",
            "adapter": "gsm8k",
            "data_files": {
                "train": [str(DATA / "gsm8k" / "train.parquet")],
                "test": [str(DATA / "gsm8k" / "test.parquet")],
            },
            "eval_split": "test",
            "seed": 0,
            "instruction": "Put the final answer in \\boxed{}.",
        },
    }
    code = {
        "name": "code",
        "prompts": {
            "kind": "hf",
            "adapter": "mbpp",
            "data_files": {"train": [str(DATA / "mbpp" / "train.parquet")]},
            "n_eval": 1,
        },
        "reward": {"kind": "code", "mode": "all_pass", "time_limit_s": 1, "memory_mb": 256},
    }
    instruct = {
        "name": "if",
        "prompts": {
            "kind": "hf",
            "adapter": "ifeval",
            "data_files": {"train": [str(DATA / "ifeval" / "train.parquet")]},
            "n_eval": 1,
        },
    }
    return [math, code, instruct] if _sandbox_runs() else [math, instruct]


def _config(data: dict[str, Any]) -> None:
    data["name"] = "hf-parquet"
    data["domains"] = _domains()
    stage = {
        "grpo": {"group_size": 4, "prompts_per_step": 2, "budget": {"max_new_tokens": 16}},
        "advance": {"max_steps": STEPS_PER_STAGE},
        "eval": {"every": 2, "samples": 4, "temperature": 1.0, "metrics": list(METRICS)},
    }
    data["stages"] = [{"domain": d["name"], **json.loads(json.dumps(stage))} for d in data["domains"]]


@pytest.fixture(scope="module")
def parquet_run(e2e: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cfg: CascadeConfig = e2e.config(tmp_path_factory.mktemp("hf-parquet"), _config)
    logged = e2e.run(cfg)
    run_dir = cfg.output_dir / cfg.name
    return {
        "cfg": cfg,
        "result": logged.result,
        "run_dir": run_dir,
        "rows": e2e.rows(e2e.sqlite_url(run_dir)),
    }


def test_the_cascade_completes_with_steps_and_evals(parquet_run: dict[str, Any]) -> None:
    cfg, rows = parquet_run["cfg"], parquet_run["rows"]
    assert parquet_run["result"].finished
    assert rows.run_status == "completed"
    names = [d.name for d in cfg.domains]
    assert [(i, d, state) for i, _, d, state in rows.stages] == [
        (i, name, "completed") for i, name in enumerate(names)
    ]
    for i in range(len(names)):
        assert [step for s, step, _, _ in rows.steps if s == i] == list(range(1, STEPS_PER_STAGE + 1))
    last = len(names) * STEPS_PER_STAGE
    # every domain evaluated at the start and after every second step
    assert sorted((g, d) for _, _, g, d, *_ in rows.evals) == sorted(
        (g, d) for g in range(0, last + 1, 2) for d in names
    )


def test_sampled_eval_metrics_with_intervals(parquet_run: dict[str, Any]) -> None:
    cfg, rows = parquet_run["cfg"], parquet_run["rows"]
    n_eval = {d.name: len(load_problems(d, "eval")) for d in cfg.domains}
    assert n_eval["math"] == 2 and n_eval["if"] == 1  # gsm8k's test split; one ifeval row held out
    for (_, _, _, domain, score, n, reasons), metrics in zip(rows.evals, rows.eval_metrics, strict=True):
        assert n == n_eval[domain] and sum(reasons.values()) == n
        assert list(metrics) == METRICS
        assert metrics["greedy"]["value"] == score
        for name, m in metrics.items():
            assert m["n"] == n, (domain, name)
            assert m["method"] in ("wilson", "bootstrap"), (domain, name)
            assert 0.0 <= m["low"] <= m["value"] <= m["high"] <= 1.0, (domain, name, m)
        assert metrics["pass@2"]["value"] >= metrics["avg@4"]["value"] - 1e-12
    # Every verdict came from the domain's verifier (code: the sandbox), none from its failing.
    for _, _, _, _, _, _, reasons in rows.evals:
        assert INFRA_ERROR not in reasons
    for _, _, _, metrics in rows.steps:
        assert INFRA_ERROR not in metrics["reasons"]


def _parquet_rows(adapter: str, split: str) -> list[str]:
    path = DATA / adapter / f"{split}.parquet"
    return [str(v) for v in pq.read_table(path).column(TEXT_COLUMN[adapter]).to_pylist()]


def test_trained_samples_are_parquet_rows(parquet_run: dict[str, Any]) -> None:
    cfg, rows = parquet_run["cfg"], parquet_run["rows"]
    domains = {d.name: d for d in cfg.domains}
    train = {name: {p.id: p for p in load_problems(d, "train")} for name, d in domains.items()}
    held_out = {name: {p.id for p in load_problems(d, "eval")} for name, d in domains.items()}
    stage_of = {g: s for s, _, g, _ in rows.steps}
    lines = (parquet_run["run_dir"] / SAMPLES_LOG).read_text().splitlines()
    assert len(lines) == len(rows.steps)
    seen: dict[str, set[str]] = {name: set() for name in domains}
    for line in lines:
        record = json.loads(line)
        domain = cfg.stages[stage_of[record["global_step"]]].domain
        sample_ids = record["sample_ids"]
        assert len(sample_ids) == 2 * 4  # prompts_per_step x group_size
        for sid in sample_ids:
            problem_id = sid.split("/", 1)[1].rsplit("/", 1)[0]  # b<batch>/<problem id>/<j>
            assert problem_id in train[domain], (domain, sid)
            assert problem_id not in held_out[domain], f"{sid}: an eval row was trained on"
            seen[domain].add(problem_id)
    for domain, ids in seen.items():
        assert ids, f"{domain}: nothing trained"
        source = domains[domain].prompts
        for problem_id in ids:
            problem = train[domain][problem_id]
            split, row = problem.meta["source_split"], problem.meta["source_row"]
            assert [str(f) for f in source.data_files[split]][0].endswith(".parquet")
            # the prompt trained on is the text of that row of the parquet file
            assert problem.prompt.startswith(_parquet_rows(source.adapter, split)[row]), problem_id

"""Benchmark: a GRPO step in embedded vs distributed mode on the same config, in the same run,
and the learner's idle fraction without (`max_staleness: 0`) and with (`1`) overlap.

Starts the rollout, reward and teacher services once (`cascade.up.stack.LocalStack`, needs Redis on
127.0.0.1:6379), runs the same one-stage cascade embedded (in this process) and distributed
(learner + 2 rollout workers) and reads each run's step metrics back from its SQLite store.
Writes `bench/results/e2e.json` and prints a markdown table.

Usage: `.venv/bin/python bench/e2e.py [MODEL_DIR] [--steps N]` (default: a random tiny model;
zero-variance groups are kept so every step backpropagates, as a trained model's would).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import yaml
from sqlalchemy import select

from cascade.config import load_cascade_config
from cascade.runner.embedded import embedded_runner
from cascade.store import repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Run
from cascade.up.stack import LocalStack

OUT = Path(__file__).parent / "results" / "e2e.json"


def config(model: Path, out: Path, *, staleness: int, steps: int) -> dict[str, Any]:
    return {
        "name": f"bench-s{staleness}",
        "seed": 0,
        "model": {"path": str(model)},
        "domains": [{"name": "math", "prompts": {"kind": "synthetic", "n_train": 256, "n_eval": 8}}],
        "stages": [
            {
                "domain": "math",
                "grpo": {
                    "group_size": 8,
                    "prompts_per_step": 8,
                    "budget": {"max_new_tokens": 24},
                    "max_staleness": staleness,
                },
                "filter": {"drop_zero_variance": False},
                "advance": {"max_steps": steps},
                "eval": {"every": 1000},
            }
        ],
        "checkpoint": {"every": 1000},
        "rollout": {"seeding": "per_request", "prompts_per_request": 4},
        "output_dir": str(out),
    }


def step_metrics(db_url: str) -> list[dict[str, Any]]:
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            run_id = s.scalars(select(Run.id)).one()
            return [p.metrics for p in repo.load_history(s, run_id).steps]
    finally:
        engine.dispose()


def summarize(metrics: list[dict[str, Any]]) -> dict[str, float]:
    body = metrics[1:] or metrics  # the first step pays one-off costs
    out = {"step_s_median": statistics.median(m["time_step_s"] for m in body), "steps": len(metrics)}
    if "idle_fraction" in body[0]:
        out["idle_fraction_mean"] = statistics.mean(m["idle_fraction"] for m in body)
        out["push_s_median"] = statistics.median(m["time_push_s"] for m in body)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    model = args.model
    if model is None:
        from cascade.bootstrap.policy import TinyModelSpec, save_untrained_model

        model = save_untrained_model(root / "model", TinyModelSpec(seed=0))
    stack = LocalStack(
        config=root / "unset.yaml", model=model.resolve(), run_dir=root / "unset", log_dir=root / "logs",
        celery_workers=0,
    )
    results: dict[str, Any] = {"model": str(args.model or "random tiny model"), "steps": args.steps}
    try:
        stack.start_services()
        for s in (0, 1):
            path = root / f"s{s}.yaml"
            path.write_text(yaml.safe_dump(config(model, root / "runs", staleness=s, steps=args.steps)))
            cfg = load_cascade_config(path)
            emb_dir = root / f"embedded-s{s}"
            t0 = time.perf_counter()
            embedded_runner(cfg, run_dir=emb_dir, log=lambda _: None).run()
            results[f"embedded_s{s}"] = {
                **summarize(step_metrics(f"sqlite:///{emb_dir / 'cascade.db'}")),
                "wall_s": time.perf_counter() - t0,
            }
            dist_dir = root / f"distributed-s{s}"
            stack.config, stack.run_dir, stack.db = path, dist_dir, None
            stack.stream_prefix = f"cascade:bench:{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            for i in range(2):
                stack.worker(i)
            stack.start_learner()
            code = stack.wait(timeout_s=600)
            stack.stop_run()
            if code != 0:
                raise RuntimeError(f"learner failed ({code}); logs in {stack.log_dir}")
            results[f"distributed_s{s}"] = {
                **summarize(step_metrics(f"sqlite:///{dist_dir / 'cascade.db'}")),
                "wall_s": time.perf_counter() - t0,
            }
    finally:
        stack.stop()
    shutil.rmtree(root, ignore_errors=True)
    for s in (0, 1):
        d, e = results[f"distributed_s{s}"], results[f"embedded_s{s}"]
        results[f"ratio_step_distributed_over_embedded_s{s}"] = d["step_s_median"] / e["step_s_median"]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))
    print("| mode | max_staleness | median step (s) | learner idle | weight push (s) |")
    print("|---|---|---|---|---|")
    for s in (0, 1):
        for mode in ("embedded", "distributed"):
            r = results[f"{mode}_s{s}"]
            idle = f"{r['idle_fraction_mean']:.0%}" if "idle_fraction_mean" in r else "-"
            push = f"{r['push_s_median']:.3f}" if "push_s_median" in r else "-"
            print(f"| {mode} | {s} | {r['step_s_median']:.3f} | {idle} | {push} |")
    print(f"written {OUT}")


if __name__ == "__main__":
    main()

"""Distillation's effect over seeds (`make ablation-seeds`): the demo cascade with and without
distillation for each seed, then per domain the paired difference of final-minus-best (with
minus without) with a t interval over seeds, and each stage's gain on its own domain.

One seed's "final - best" is inside its eval's noise at the tiny model's scale; the method's own
advice is to read trends over at least three seeds. Each seed's two runs differ only in the
distillation terms (same seed, data and config), so their difference is paired: the interval is
over the seeds' differences, and the effect holds outside noise when it excludes 0.

Usage: `.venv/bin/python bench/ablation_seeds.py [--config C] [--seeds 0 1 2] [--jobs 2]`; the
runs go to `<output_dir>/<name>-seed<S>[-no-distill]` and resume when interrupted. Writes
`bench/results/ablation_seeds.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cascade.config import load_cascade_config
from cascade.runner.report import load_regression_table
from cascade.runner.seed_study import own_stage_gains, paired_effects

ROOT = Path(__file__).resolve().parents[1]


def _run(config: Path, seed: int, distill: bool, run_dir: Path, threads: int) -> float:
    argv = [str(ROOT / ".venv" / "bin" / "cascade"), "run", str(config), "--seed", str(seed)]
    argv += ["--run-dir", str(run_dir), "--resume", "--no-progress"] + ([] if distill else ["--no-distill"])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.monotonic()
    log = run_dir.with_name(run_dir.name + ".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: see {log}")
    return time.monotonic() - t0


def _pp(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "tiny-cascade.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each on cores / jobs threads)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ablation_seeds"))
    args = parser.parse_args()
    config = Path(args.config)
    cfg = load_cascade_config(config)
    runs = {
        (seed, distill): cfg.output_dir / f"{cfg.name}-seed{seed}{'' if distill else '-no-distill'}"
        for seed in args.seeds
        for distill in (True, False)
    }
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {k: pool.submit(_run, config, k[0], k[1], d, threads) for k, d in runs.items()}
        seconds = {
            f"seed{k[0]}-{'distill' if k[1] else 'no-distill'}": f.result() for k, f in futures.items()
        }
    wall = time.monotonic() - t0
    tables = {
        seed: {
            "distill": load_regression_table(runs[(seed, True)] / "report"),
            "no_distill": load_regression_table(runs[(seed, False)] / "report"),
        }
        for seed in args.seeds
    }
    stage_domains = [s.domain for s in cfg.stages]
    effects = paired_effects(tables)
    gains = own_stage_gains({s: t["distill"] for s, t in tables.items()}, stage_domains)
    result = {
        "config": str(config.resolve().relative_to(ROOT))
        if config.resolve().is_relative_to(ROOT)
        else str(config),
        "seeds": args.seeds,
        "commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip(),
        "wall_s": round(wall, 1),
        "run_s": {k: round(v, 1) for k, v in seconds.items()},
        "final_minus_best_difference": effects,
        "own_stage_gain": gains,
        "tables": {str(s): {k: t.to_dict() for k, t in pair.items()} for s, pair in tables.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    seeds = ", ".join(str(s) for s in args.seeds)
    lines = [f"# Distillation over seeds ({seeds}): `{result['config']}`", ""]
    lines += [
        f"Commit `{result['commit']}`; {len(runs)} runs, {args.jobs} at a time, {wall / 60:.0f} minutes.",
        "",
    ]
    lines += ["## Final minus best (points), with and without distillation, paired by seed", ""]
    lines += [
        "| domain | "
        + " | ".join(f"seed {s}: with / without" for s in args.seeds)
        + " | difference (95% t) |"
    ]
    lines += ["|:---|" + "---:|" * (len(args.seeds) + 1)]
    for domain, e in effects.items():
        cells = [
            f"{_pp(e['per_seed'][s]['distill'])} / {_pp(e['per_seed'][s]['no_distill'])}"
            if s in e["per_seed"]
            else "—"
            for s in args.seeds
        ]
        if e["interval"] is None:
            diff = "—"
        else:
            flag = "outside noise" if e["outside_noise"] else "within noise"
            diff = f"{_pp(e['mean_difference'])} [{_pp(e['interval'][0])}, {_pp(e['interval'][1])}], {flag}"
        lines.append(f"| {domain} | " + " | ".join(cells) + f" | {diff} |")
    lines += ["", "## Each stage's gain on its own domain (points, with distillation)", ""]
    lines += ["| stage | " + " | ".join(f"seed {s}" for s in args.seeds) + " | 95% t interval |"]
    lines += ["|:---|" + "---:|" * (len(args.seeds) + 1)]
    for label, g in gains.items():
        cells = [_pp(g["per_seed"].get(s)) for s in args.seeds]
        ci = "—" if g["interval"] is None else f"[{_pp(g['interval'][0])}, {_pp(g['interval'][1])}]"
        if g["outside_noise"]:
            ci += ", outside noise"
        lines.append(f"| {label} ({g['domain']}) | " + " | ".join(cells) + f" | {ci} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the learner's weight push to 1 and 2 rollout replicas, against checkpoint size.

For random Qwen3 models of growing size (the tiny model's width up to the 258 MB case of
`bench/rollout.py`), two `services.rollout.main` processes serve the model; the learner's own
push (`services.learner.replicas.RolloutReplicas.push`: `UpdateWeights` with a checkpoint path
to every replica at once, in threads, returning when all hold the new version) is timed to the
first replica alone and to both, alternating two checkpoints so every push changes the weights.
Median of `--repeats`; the checkpoint is already on disk (the learner's save is not included).

Usage: `.venv/bin/python bench/weight_push.py [--repeats 3 --max-size 3]`;
writes `bench/results/weight_push.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from pathlib import Path

from model_services import ROOT, checkpoint_bytes, random_model, service

from cascade.transport.rollout_replicas import Addresses
from services.learner.replicas import RolloutReplicas

RESULTS = ROOT / "bench" / "results" / "weight_push.json"
SIZES = ((128, 4), (512, 8), (768, 12))


def push_times(addresses: list[str], checkpoints: list[Path], repeats: int) -> dict[str, float]:
    replicas = RolloutReplicas(Addresses(addresses), log=lambda line: None, wait_s=30)
    replicas.attach(0)
    wall, slowest = [], []
    for i in range(repeats + 1):  # the first push warms the page cache: not counted
        m = replicas.push(str(checkpoints[i % 2]), i)
        assert m["rollout_replicas"] == len(addresses) and m["replica_failures"] == 0, m
        if i:
            wall.append(m["time_push_s"])
            slowest.append(m["time_push_replica_max_s"])
    replicas.close()
    return {
        "push_s": round(statistics.median(wall), 4),
        "slowest_replica_s": round(statistics.median(slowest), 4),
    }


def measure_push(tmp: Path, hidden: int, layers: int, repeats: int) -> tuple[dict, dict, float]:
    """Two rollout replicas of a random model of this size: the push to the first alone and to
    both (medians), and the checkpoint's size in MB."""
    base = tmp / "base-tiny"
    a = random_model(tmp / f"m{hidden}-a", hidden=hidden, layers=layers, seed=0, base=base)
    b = random_model(tmp / f"m{hidden}-b", hidden=hidden, layers=layers, seed=1, base=base)
    with contextlib.ExitStack() as stack:
        addresses = [
            stack.enter_context(
                service("services.rollout.main", tmp / f"rollout-{hidden}-{i}.log", "--model", str(a))
            )
            for i in range(2)
        ]
        one = push_times(addresses[:1], [b, a], repeats)
        two = push_times(addresses, [b, a], repeats)
    return one, two, checkpoint_bytes(b) / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-size", type=int, default=len(SIZES), help="how many of the model sizes to time")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp_s:
        tmp = Path(tmp_s)
        for hidden, layers in SIZES[: args.max_size]:
            one, two, size_mb = measure_push(tmp, hidden, layers, args.repeats)
            row = {
                "model": f"hidden {hidden}, {layers} layers",
                "checkpoint_mb": round(size_mb, 1),
                "one_replica": one,
                "two_replicas": two,
                "two_vs_one": round(two["push_s"] / one["push_s"], 2),
                "mb_per_s_two": round(2 * size_mb / two["push_s"], 1),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "pushes": rows,
        "repeats": args.repeats,
        "machine": "2 shared CPU cores, no GPU; HF engine on CPU (swap mode), one torch thread per replica",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""Benchmark: the rollout service against the same engine in-process, and weight-update latency
against checkpoint size.

1. Throughput: the same batch (random token prompts of 8-24 tokens, `--prompts` x `--group`
   completions, `--max-tokens` new tokens, fixed seed, so both paths sample identical tokens)
   through `HFEngine.generate` in this process and through `Generate` RPCs to a
   `services.rollout.main` subprocess; runs alternate (same run, same load), median of
   `--repeats`. Both sides use one torch thread.
2. Weight updates: for random Qwen3 models of growing size, `UpdateWeights` (checkpoint path)
   and `UpdateWeightsStream` (tensors streamed in 4 MiB chunks) to a service serving that model;
   client-side wall time, median of 3.

Usage: `.venv/bin/python bench/rollout.py [--prompts 16 --group 8 --max-tokens 32 --repeats 5]`;
writes `bench/results/rollout.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from model_services import ROOT, checkpoint_bytes, random_model, service
from safetensors.torch import load_file

from cascade.engine.base import SamplingSettings
from cascade.engine.hf_engine import HFEngine
from cascade.transport.rollout_client import RolloutClient

RESULTS = ROOT / "bench" / "results" / "rollout.json"
SIZES = ((128, 4), (256, 8), (512, 8), (768, 12))


def throughput(model: Path, tmp: Path, args: argparse.Namespace) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 384, (int(n),), generator=gen).tolist()
        for n in torch.randint(8, 25, (args.prompts,))
    ]
    sampling = SamplingSettings(max_tokens=args.max_tokens, temperature=1.0, seed=1)
    engine = HFEngine.from_dir(model)
    runs: dict[str, list[float]] = {"in_process": [], "service": []}
    tokens: dict[str, int] = {}
    with service("services.rollout.main", tmp / "rollout.log", "--model", str(model)) as address:
        client = RolloutClient(address)
        engine.generate(prompts, args.group, sampling)  # warm-up both
        client.generate(prompts, group_size=args.group, sampling=sampling)
        for _ in range(args.repeats):
            start = time.perf_counter()
            local = engine.generate(prompts, args.group, sampling).generation
            runs["in_process"].append(time.perf_counter() - start)
            tokens["in_process"] = sum(len(c) for c in local.completion_ids)
            start = time.perf_counter()
            remote = client.generate(prompts, group_size=args.group, sampling=sampling).result.generation
            runs["service"].append(time.perf_counter() - start)
            tokens["service"] = sum(len(c) for c in remote.completion_ids)
        client.close()
    assert remote.completion_ids == local.completion_ids, "same seed, same weights: same tokens"
    rate = {k: tokens[k] / statistics.median(v) for k, v in runs.items()}
    return {
        "batch": {"prompts": args.prompts, "group_size": args.group, "max_tokens": args.max_tokens},
        "tokens_per_batch": tokens["service"],
        "tokens_per_s": {k: round(v, 1) for k, v in rate.items()},
        "median_s": {k: round(statistics.median(v), 4) for k, v in runs.items()},
        "service_vs_in_process": round(rate["service"] / rate["in_process"], 3),
    }


def update_latency(tmp: Path, sizes: tuple[tuple[int, int], ...]) -> list[dict[str, object]]:
    rows = []
    base = tmp / "base-tiny"
    for hidden, layers in sizes:
        served = random_model(tmp / f"m{hidden}x{layers}-a", hidden=hidden, layers=layers, seed=0, base=base)
        other = random_model(tmp / f"m{hidden}x{layers}-b", hidden=hidden, layers=layers, seed=1, base=base)
        tensors = load_file(str(other / "model.safetensors"))
        times: dict[str, list[float]] = {"checkpoint": [], "stream": []}
        with service(
            "services.rollout.main", tmp / f"update-{hidden}.log", "--model", str(served)
        ) as address:
            client = RolloutClient(address)
            for i in range(3):
                start = time.perf_counter()
                client.update_weights(str(other if i % 2 == 0 else served))
                times["checkpoint"].append(time.perf_counter() - start)
                start = time.perf_counter()
                client.stream_weights(tensors)
                times["stream"].append(time.perf_counter() - start)
            client.close()
        size = checkpoint_bytes(other)
        row = {
            "model": f"hidden {hidden}, {layers} layers",
            "checkpoint_mb": round(size / 2**20, 1),
            "seconds": {k: round(statistics.median(v), 4) for k, v in times.items()},
            "mb_per_s": {k: round(size / 2**20 / statistics.median(v), 1) for k, v in times.items()},
        }
        print(f"  {row['model']}: {row['checkpoint_mb']} MB -> {row['seconds']}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-size", type=int, default=len(SIZES), help="how many of the model sizes to time")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp_s:
        tmp = Path(tmp_s)
        model = random_model(tmp / "tiny", base=tmp / "base-tiny")
        print("throughput (same batch, same run)...", flush=True)
        result: dict[str, object] = {"throughput": throughput(model, tmp, args)}
        print(json.dumps(result["throughput"], indent=1), flush=True)
        print("weight-update latency vs checkpoint size...", flush=True)
        result["weight_update"] = update_latency(tmp, SIZES[: args.max_size])
    result["machine"] = "2 shared CPU cores, no GPU; HF engine on CPU, one torch thread per side"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

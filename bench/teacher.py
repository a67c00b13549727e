"""Benchmark: the teacher service's wire cost per distillation mode, and its speed against the
same scoring in-process.

One teacher (a random tiny Qwen3, vocabulary 384) scores the same batch (`--sequences` random
prompts of 16 tokens with completions of `--completion` tokens) in each mode: `sampled`,
`topk` (k = 16 and 64) and `full`. For each: the serialized response bytes per completion
token (what crosses the wire), and tokens/s through `Logprobs` RPCs to a
`services.teacher.main` subprocess against `score_sequences` in this process (median of
`--repeats`, alternating). Also: 4 concurrent requests of a quarter of the batch each, which
the service merges into shared forwards.

Usage: `.venv/bin/python bench/teacher.py`; writes `bench/results/teacher.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from model_services import ROOT, random_model, service

from cascade.distill.modes import Mode
from cascade.distill.scoring import ScoreRequest, score_sequences
from cascade.model.loading import load_model_weights_only
from cascade.transport.teacher_client import TeacherClient

RESULTS = ROOT / "bench" / "results" / "teacher.json"
MODES: list[tuple[str, Mode, int]] = [
    ("sampled", "sampled", 0),
    ("topk16", "topk", 16),
    ("topk64", "topk", 64),
    ("full", "full", 0),
]
QWEN3_VOCAB = 151_936


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--completion", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 384, (args.sequences, 16), generator=gen).tolist()
    completions = torch.randint(3, 384, (args.sequences, args.completion), generator=gen).tolist()
    tokens = args.sequences * args.completion
    result: dict[str, object] = {"batch": {"sequences": args.sequences, "completion_tokens": args.completion}}
    with tempfile.TemporaryDirectory(prefix="bench-teacher-") as tmp_s:
        tmp = Path(tmp_s)
        model_dir = random_model(tmp / "teacher")
        model = load_model_weights_only(model_dir)
        flags = ["--teacher", f"math={model_dir}"]
        with service("services.teacher.main", tmp / "teacher.log", *flags) as address:
            client = TeacherClient(address)
            modes: dict[str, object] = {}
            for _ in range(2):  # warm-up both sides in every mode before timing any
                for _, mode, k in MODES:
                    score_sequences(model, [ScoreRequest(prompts, completions, mode, topk=k)], pad_id=0)
                    client.logprobs("math", prompts, completions, mode=mode, topk=k)
            for label, mode, k in MODES:
                request = ScoreRequest(prompts, completions, mode, topk=k)
                local_s, remote_s = [], []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    score_sequences(model, [request], pad_id=0)
                    local_s.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    reply = client.logprobs("math", prompts, completions, mode=mode, topk=k)
                    remote_s.append(time.perf_counter() - start)
                local, remote = tokens / statistics.median(local_s), tokens / statistics.median(remote_s)
                modes[label] = {
                    "wire_bytes_per_token": round(reply.wire_bytes / tokens, 2),
                    "tokens_per_s": {"in_process": round(local, 1), "service": round(remote, 1)},
                    "service_vs_in_process": round(remote / local, 3),
                }
                print(label, modes[label], flush=True)
            result["modes"] = modes

            quarter = args.sequences // 4
            seq_s, conc_s = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for i in range(4):
                    sl = slice(i * quarter, (i + 1) * quarter)
                    client.logprobs("math", prompts[sl], completions[sl])
                seq_s.append(time.perf_counter() - start)
                threads = [
                    threading.Thread(
                        target=client.logprobs,
                        args=(
                            "math",
                            prompts[i * quarter : (i + 1) * quarter],
                            completions[i * quarter : (i + 1) * quarter],
                        ),
                    )
                    for i in range(4)
                ]
                start = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                conc_s.append(time.perf_counter() - start)
            result["batching"] = {
                "requests": 4,
                "sequences_each": quarter,
                "sequential_s": round(statistics.median(seq_s), 4),
                "concurrent_s": round(statistics.median(conc_s), 4),
            }
            client.close()
    per_k = {label: modes[label]["wire_bytes_per_token"] for label in ("topk16", "topk64")}  # type: ignore[index]
    result["projection_qwen3_vocab"] = {
        "note": "computed, not measured: full = 4 bytes x 151,936; top-k ids become 3-byte varints",
        "full_bytes_per_token": 4 * QWEN3_VOCAB,
        "topk64_bytes_per_token": 64 * (4 + 3) + 2,
        "sampled_bytes_per_token": 4,
        "measured_topk_here": per_k,
    }
    result["machine"] = "2 shared CPU cores, no GPU; one torch thread per side"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""GPU learner-memory check: one learner update of a Qwen3-0.6B-shaped model (random weights, built
here, nothing downloaded) at the recipe's settings, 128 prompts x 8 completions of up to 8K tokens,
bfloat16 autocast over float32 master weights (`learner.precision: auto`), activation
checkpointing on, micro-batches of `--mbt` padded tokens; its peak `torch.cuda.max_memory_allocated`
against the peak `cascade.runner.step_memory.estimate_step` predicts, printed BEFORE the update
runs (the expected figure is stated in advance), then both with their ratio.

The batch is `bench/learner_memory.py`'s prefabricated rollouts (prompts of 100..300 tokens,
completions with a long tail up to the max, random ids and rewards, on-policy); the update is
`run_update` with an AdamW optimizer made as `cascade/runner/training.py` makes it, after a
warm-up update on a tiny batch (AdamW's moments exist before the measured update; the peak
counter is reset after it). Prints one JSON object; exit 0 when the measured peak is within 25%
of the estimate, 1 when it is not (or the update ran out of memory), 2 with no GPU.

`--device cpu --tiny` runs the same path here in seconds (a tiny shape, 2 prompts x 8, 128
tokens, float32; the peak is the RSS over the process before the model, as
`bench/learner_memory.py` measures it): the plumbing only, exit 0 whatever the ratio (at that
size the RSS is mostly the allocator's and the runtime's, not the tensors').
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

H200_BF16_DENSE_FLOPS = 989e12
"""NVIDIA's dense bfloat16 tensor-core peak for the H100/H200 SXM (the MFU's denominator on those)."""


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--device", default="cuda", help="cuda (default), cuda:N, or cpu (with --tiny) to try it here"
    )
    p.add_argument(
        "--tiny", action="store_true", help="a tiny shape, 2 prompts x 8, 128 tokens: the plumbing"
    )
    p.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "narrow", "tiny"])
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument(
        "--mbt",
        type=int,
        default=65536,
        help="learner.micro_batch_tokens (default 65536: 24.7 GiB estimated at the recipe's step)",
    )
    p.add_argument("--no-checkpointing", action="store_true")
    p.add_argument(
        "--tolerance", type=float, default=0.25, help="relative gap allowed between measured and estimate"
    )
    args = p.parse_args()
    if args.tiny:
        args.shape, args.prompts, args.max_tokens, args.mbt = "tiny", 2, 128, 512
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.` without PYTHONPATH
    from bench.learner_memory import (
        GIB,
        GROUP,
        LR,
        PAD_ID,
        build_model,
        estimate_bytes,
        make_plan,
        make_rollouts,
        model_dims,
        peak_rss_bytes,
        release_memory,
        reset_peak_rss,
        rss_bytes,
        step_counts,
    )

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False", "torch": torch.__version__}))
        return 2
    from cascade.accel import resolve_learner
    from cascade.config import GrpoConfig, LearnerConfig, StageConfig, TokenBudget
    from cascade.engine.microbatch import MicroBatching
    from cascade.runner.frozen_models import FrozenModelCache
    from cascade.runner.update import UpdateRequest, run_update

    ckpt = not args.no_checkpointing
    vocab = {"qwen3-0.6b": 151936, "narrow": 151936, "tiny": 4096}[args.shape]
    rollouts = make_rollouts(args.prompts, GROUP, args.max_tokens, vocab)
    rows = len(rollouts["completion_ids"])
    longest = (max(map(len, rollouts["prompt_ids"])), max(map(len, rollouts["completion_ids"])))
    accel = resolve_learner(LearnerConfig(device=args.device, precision="auto"), "float32")
    act_bytes = 2 if accel.autocast_dtype is not None else 4
    est = estimate_bytes(args.shape, rows, *longest, args.mbt, ckpt, compute_dtype_bytes=act_bytes)
    if est is None or "total" not in est:
        print(json.dumps({"error": f"no usable cascade.runner.step_memory.estimate_step: {est}"}))
        return 1
    counts = step_counts(rollouts, args.mbt)
    expected = {
        "expected_peak_gib": est["total"] / GIB,
        "estimate_parts_gib": {k: v / GIB for k, v in est.items() if isinstance(v, int) and v >= GIB / 100},
        "shape": args.shape,
        "step": f"{args.prompts}x{GROUP}",
        "max_tokens": args.max_tokens,
        "micro_batch_tokens": args.mbt,
        "activation_checkpointing": ckpt,
        "learner": accel.describe(),
        "micro_batches": counts["micro_batches"],
        "real_tokens": counts["real_tokens"],
        "padded_tokens": counts["padded_tokens"],
    }
    print("expected (from the estimate, before the update): " + json.dumps(expected), flush=True)

    rss_runtime = rss_bytes()
    model = build_model(args.shape, device=str(accel.device))
    dims = model_dims(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    frozen = FrozenModelCache(accel.frozen_dtype, accel.device)
    stage = StageConfig(
        domain="math",
        grpo=GrpoConfig(
            group_size=GROUP,
            prompts_per_step=args.prompts,
            learning_rate=LR,
            budget=TokenBudget(max_new_tokens=args.max_tokens),
        ),
    )
    batching = MicroBatching(tokens=args.mbt, activation_checkpointing=ckpt)

    def request(plan: Any) -> UpdateRequest:
        return UpdateRequest(
            rl=plan,
            stage=stage,
            stage_step=0,
            lr=LR,
            pad_id=PAD_ID[args.shape],
            reference=None,
            batching=batching,
        )

    warm = make_plan(
        {
            "prompt_ids": [[5] * 8] * 2,
            "completion_ids": [[7] * 8, [9] * 8],
            "rewards": torch.tensor([[0.0, 1.0]]),
            "group": 2,
        }
    )
    run_update(model, optimizer, request(warm), lambda: [], accel=accel, frozen=frozen)
    req = request(make_plan(rollouts))
    release_memory()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    rss_before = rss_bytes()
    reset_peak_rss()
    t0 = time.perf_counter()
    error = None
    try:
        metrics, _ = run_update(model, optimizer, req, lambda: [], accel=accel, frozen=frozen)
    except torch.OutOfMemoryError as e:
        metrics, error = {}, f"out of memory: {str(e).splitlines()[0]}"
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if cuda:
        measured = torch.cuda.max_memory_allocated()
        what = "torch.cuda.max_memory_allocated (weights, gradients, AdamW state, the update's tensors)"
        reserved = torch.cuda.max_memory_reserved()
        device = torch.cuda.get_device_name(accel.device)
    else:
        measured = peak_rss_bytes() - rss_runtime
        what = "peak RSS - RSS before the model existed"
        reserved, device = None, "cpu"
    forward = counts["completion_tokens"] + counts["prompt_tokens_shared"]
    model_flops = 6 * dims["params_body"] * forward + 6 * dims["head_d_x_v"] * counts["completion_tokens"]
    ratio = est["total"] / measured if measured else float("nan")
    ok = error is None and abs(measured - est["total"]) <= args.tolerance * measured
    report = {
        **expected,
        "device": device,
        "torch": torch.__version__,
        "measured_peak_gib": measured / GIB,
        "measured": what,
        "max_memory_reserved_gib": None if reserved is None else reserved / GIB,
        "rss_before_update_gib": rss_before / GIB,
        "estimate_over_measured": ratio,
        "within_tolerance": ok,
        "tolerance": args.tolerance,
        "error": error,
        "step_s": wall,
        "tokens_per_s": counts["real_tokens"] / wall,
        "model_flops": model_flops,
        "mfu_vs_989_tflops": model_flops / (wall * H200_BF16_DENSE_FLOPS) if cuda else None,
        "loss_rl": metrics.get("loss_rl"),
        "grad_norm": metrics.get("grad_norm"),
        "params": dims["params_total"],
    }
    print(json.dumps(report, indent=1))
    if not cuda:  # the plumbing: at --tiny's size the RSS is the allocator's, not the tensors'
        return 0 if error is None else 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

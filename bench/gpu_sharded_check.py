"""Multi-rank learner check: a few sharded updates (FSDP2 over every rank, NCCL, the
`learner.precision: auto` policy: bfloat16 compute over float32 master weights and float32
gradient reductions) against the same updates by one process on the same batch.

Run under torchrun, one rank per GPU (`bench/gpu_check.sh` does it when the machine has 2 or
more GPUs):

    torchrun --standalone --nproc-per-node=$(nvidia-smi -L | wc -l) bench/gpu_sharded_check.py

Every rank builds the same random Qwen3 (`bench/gpu_check.build_model`, seed 0) and the same
synthetic RL step (`bench/learner_scale.synthetic_plan`: groups x completions, on-policy) plus a
`sampled` distillation term (a perturbed copy of the model as the teacher, its tokens computed
once on the CPU in float32), shards the model with the learner's own `shard_policy` into a
`RankShard` and trains its share of the groups and distillation rows (`UpdateRequest.share`,
`share_all`) with `run_update`, the loss normalised over all ranks. Rank 0 then trains an
unsharded copy on the whole batch, on its own GPU with the same precision policy, through the
same `run_update` without a process group: the one-process learner.

Compared: the first step's RL loss, distillation loss and gradient norm (global, clipped on the
global norm), relative difference. Tolerance: 2e-2 on the losses and 5e-2 on the gradient norm
in bfloat16 (the sharded side all-gathers bfloat16 parameters, the one-process side autocasts
float32 ones: different rounding, as in `bench/gpu_learner_check.py`); 1e-5 on all three for
float32, where every step is checked (the sharded equivalence the CPU tests assert). The later
steps are reported in bfloat16, not checked (Adam's normalised update turns rounding-level
gradient differences into visible weight differences).

Prints one JSON object and PASS or FAIL from rank 0; exit 0 on PASS, 1 on FAIL, 2 without a
usable GPU, 0 with a SKIP line for a world of fewer than 2 ranks. `--device cpu` (gloo,
float32) runs the same code here with CPU ranks:

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 \\
        bench/gpu_sharded_check.py --device cpu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `bench.*` and `cascade` from the checkout
    sys.path.insert(0, str(ROOT))

KEYS = ("loss_rl", "loss_distill", "grad_norm")
VOCAB = 384
PAD_ID = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (NCCL, one GPU per rank) or cpu (gloo)")
    p.add_argument("--precision", choices=["auto", "float32"], default="auto")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8, help="groups of the RL step")
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--tokens", type=int, default=24, help="longest completion")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    return p.parse_args(argv)


def tolerances(precision: str) -> dict[str, float]:
    if precision == "bfloat16":
        return {"loss_rl": 2e-2, "loss_distill": 2e-2, "grad_norm": 5e-2}
    return dict.fromkeys(KEYS, 1e-5)


def make_model(args: argparse.Namespace, device: torch.device | str) -> Any:
    from bench.gpu_check import build_model

    return build_model(args.hidden, args.layers, VOCAB, 256, str(device), torch.float32).train()


def make_batch(args: argparse.Namespace) -> tuple[Any, list[Any], Any]:
    """(RL plan, distillation data, stage): the same on every rank (seeded, computed on the CPU)."""
    from bench.learner_scale import _tokens, synthetic_plan
    from cascade.config import StageConfig
    from cascade.distill.modes import local_teacher_tokens
    from cascade.distill.samples import DistillSamples
    from cascade.engine.batch import build_batch
    from cascade.engine.logprobs import completion_logprobs
    from cascade.runner.distill import DistillData

    stage = StageConfig.model_validate(
        {
            "domain": "code",
            "grpo": {"learning_rate": 1e-4, "max_grad_norm": 1.0},
            "distill": {"teachers": ["math"], "loss": "sampled"},
        }
    )
    plan = synthetic_plan(args.prompts, args.group, args.tokens, VOCAB)
    g = torch.Generator().manual_seed(1)
    prompts = [_tokens(g, VOCAB, 8, 24) for _ in range(args.prompts)]
    completions = [_tokens(g, VOCAB, 4, args.tokens) for _ in range(args.prompts)]
    sb = build_batch(prompts, completions, PAD_ID)
    model = make_model(args, "cpu")
    with torch.no_grad():
        lp = completion_logprobs(model, sb, 1.0)
        rollout = [lp[i, : len(c)].tolist() for i, c in enumerate(completions)]
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
        tokens = local_teacher_tokens(model, sb, stage.distill)
    samples = DistillSamples("math", prompts, completions, rollout, 1.0)
    return plan, [DistillData(samples, sb, tokens)], stage


def pick(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(metrics[k]) for k in KEYS if k in metrics}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cascade.parallel.world import launched_world

    world = launched_world()
    if world.size < 2:
        print(
            f"SKIP: the sharded check needs 2 or more ranks (WORLD_SIZE={world.size}); run it under torchrun"
        )
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False", "torch": torch.__version__}))
        return 2
    if args.device.startswith("cuda") and torch.cuda.device_count() < world.size:
        print(f"SKIP: {world.size} ranks but {torch.cuda.device_count()} GPUs (one GPU per rank)")
        return 0

    import torch.distributed as dist

    from cascade.accel import resolve_learner
    from cascade.config import LearnerConfig
    from cascade.parallel.fsdp import shard_policy
    from cascade.parallel.launch import start_rank
    from cascade.parallel.world import leave_world
    from cascade.runner.frozen_models import FrozenModelCache
    from cascade.runner.sharded import RankShard
    from cascade.runner.update import UpdateRequest, run_update, share_all

    device = "cuda" if args.device.startswith("cuda") else args.device
    accel = resolve_learner(LearnerConfig(device=device, precision=args.precision), "float32")  # type: ignore[arg-type]
    world, accel = start_rank(accel)
    try:
        backend = dist.get_backend()
        plan, distill, stage = make_batch(args)
        req = UpdateRequest(
            rl=plan, stage=stage, stage_step=0, lr=stage.grpo.learning_rate, pad_id=PAD_ID, reference=None
        )
        own = req.share(world.rank, world.size)
        own_distill = share_all(distill, world.rank, world.size, PAD_ID)

        shard = RankShard(world, accel, "float32")
        shard.model = make_model(args, accel.device)
        shard_policy(shard.model, world, accel)  # type: ignore[arg-type]
        shard.start_stage(stage.grpo.learning_rate, stage.grpo.weight_decay)
        sharded = [pick(shard.update(own, lambda: own_distill)[0]) for _ in range(args.steps)]

        verdict: list[Any] = [None]
        if world.driver:
            model = make_model(args, accel.device)
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=stage.grpo.learning_rate, weight_decay=stage.grpo.weight_decay
            )
            frozen = FrozenModelCache(accel.frozen_dtype, accel.device)
            reference = [
                pick(run_update(model, optimizer, req, lambda: distill, accel=accel, frozen=frozen)[0])
                for _ in range(args.steps)
            ]
            tol = tolerances(accel.precision)
            checked = range(1) if accel.precision == "bfloat16" else range(args.steps)
            diffs = [
                {k: abs(s[k] - r[k]) / max(abs(r[k]), 1e-8) for k in r}
                for s, r in zip(sharded, reference, strict=True)
            ]
            ok = all(set(sharded[i]) == set(reference[i]) for i in checked) and all(
                diffs[i][k] <= tol[k] for i in checked for k in diffs[i]
            )
            report = {
                "device": torch.cuda.get_device_name(accel.device) if accel.device.type == "cuda" else "cpu",
                "torch": torch.__version__,
                "backend": backend,
                "ranks": world.size,
                "learner": accel.describe(),
                "model": f"random Qwen3, hidden {args.hidden}, {args.layers} layers",
                "batch": f"{args.prompts} groups x {args.group}, distillation {args.prompts} rows",
                "sharded": sharded,
                "one_process": reference,
                "rel_diff": diffs,
                "tolerance_rel": tol,
                "steps_checked": list(checked),
                "match": ok,
            }
            print(json.dumps(report, indent=1))
            if args.out is not None:
                args.out.write_text(json.dumps(report, indent=1) + "\n")
            print("PASS" if ok else "FAIL", flush=True)
            verdict = [ok]
        dist.broadcast_object_list(verdict, src=0)
    finally:
        leave_world()
    return 0 if verdict[0] else 1


if __name__ == "__main__":
    sys.exit(main())

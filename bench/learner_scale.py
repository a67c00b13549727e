"""Benchmark: the learner on 1 and 2 ranks of this CPU (step time, per-rank memory) and the weight
push to 1 and 2 rollout replicas against checkpoint size.

One fixed synthetic batch built like an RL step: an `RlPlan` of `--prompts` groups x `--group`
completions (a shared prompt of 12-28 tokens per group, completions of 4..`--tokens` tokens,
group-normalised advantages, on-policy) plus a `sampled` distillation term of `--prompts`
sequences scored by a teacher (the model with its weights perturbed; the teacher's tokens are
computed once, before any timing, as the teacher service would have). The same batch is trained
`--warmup + --steps` times:

- 1 rank: `LocalTrainer.update` (`run_update` on the whole model, no process group);
- 2 ranks: this script relaunched under `torchrun --standalone` (`torchrun_argv`, gloo); every
  rank holds a `RankShard` (FSDP2 per decoder block + root, AdamW on its shards) and trains its
  share of the groups and of the distillation rows (`UpdateRequest.share`, `share_all`), as under
  `ShardedTrainer`; `step_s` adds the gather of the full weights into rank 0's generating copy
  (`RankShard.full_weights` + `load_state_dict`) that `ShardedTrainer.update` does after each
  update.

Every rank runs `--threads` torch threads (default 1, as torchrun sets them: on these 2 shared
cores two spinning threads next to other work make a step several times slower). Times are
medians over the `--steps` timed updates (each rank starts a step at a barrier; a step's time is
its slowest rank's). Bytes are each rank's local shards after the last update
(`DTensor.to_local()`): parameters, gradients and AdamW state (`exp_avg`, `exp_avg_sq`, `step`).
The push part reuses `bench/weight_push.py`'s measurement (`RolloutReplicas.push` to two
`services.rollout.main` processes) on random Qwen3 models of the tiny model's shape and larger.

Usage: `.venv/bin/python bench/learner_scale.py [--steps 8 --push-sizes 128x4,512x8]`; writes
`bench/results/learner_scale.json`. `--larger 512x8` also times the learner (1 warm-up, 3 timed
updates) on random models of those shapes. `--quick` (few steps, small batch, no push, no larger
model) is for the test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "learner_scale.json"
PAD_ID = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "tiny")
    p.add_argument("--nproc", type=int, default=2, help="ranks of the sharded case (1 is always measured)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24, help="longest completion")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--no-distill", action="store_true", help="the RL term only")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--push-sizes", default="128x4,512x8", help="HIDDENxLAYERS,... ('' for no push)")
    p.add_argument("--push-repeats", type=int, default=3)
    p.add_argument(
        "--larger", default="512x8", help="HIDDENxLAYERS,...: random models also timed ('' for none)"
    )
    p.add_argument("--larger-steps", type=int, default=3, help="timed updates of the larger models")
    p.add_argument("--quick", action="store_true", help="4 prompts x 4, 8 tokens, 1+2 steps, no push")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--rank-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.group, args.tokens, args.warmup, args.steps = 4, 4, 8, 1, 2
        args.push_sizes = args.larger = ""
    return args


# --- the batch ---------------------------------------------------------------------------------


def stage_config() -> Any:
    from cascade.config import StageConfig

    return StageConfig.model_validate(
        {"domain": "code", "distill": {"teachers": ["math"], "loss": "sampled"}}
    )


def _tokens(g: torch.Generator, vocab: int, lo: int, hi: int) -> list[int]:
    """Random token ids, between `lo` and `hi` of them."""
    n = int(torch.randint(lo, hi + 1, (1,), generator=g))
    return [int(t) for t in torch.randint(3, vocab, (n,), generator=g)]


def synthetic_plan(prompts: int, group: int, tokens: int, vocab: int, seed: int = 0) -> Any:
    from cascade.runner.rl import RlPlan

    g = torch.Generator().manual_seed(seed)
    rows_p, rows_c, groups, adv = [], [], [], []
    for gid in range(prompts):
        prompt = _tokens(g, vocab, 12, 28)
        rewards = torch.rand(group, generator=g)
        a = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for j in range(group):
            rows_p.append(prompt)
            rows_c.append(_tokens(g, vocab, 4, tokens))
            groups.append(gid)
            adv.append(float(a[j]))
    return RlPlan(
        metrics={},
        prompt_ids=rows_p,
        completion_ids=rows_c,
        group_ids=groups,
        advantages=adv,
        old_logprobs=None,
        temperature=1.0,
        global_rows=len(groups),
    )


def synthetic_distill(model_dir: Path, rows: int, tokens: int, vocab: int, stage: Any) -> list[Any]:
    """One teacher's `sampled` term: `rows` student sequences, their rollout log-probs the
    student's own (on-policy: every token kept), scored by the perturbed model as the teacher."""
    from cascade.distill.modes import local_teacher_tokens
    from cascade.distill.samples import DistillSamples
    from cascade.engine.batch import build_batch
    from cascade.engine.logprobs import completion_logprobs
    from cascade.model.loading import load_model_weights_only
    from cascade.runner.distill import DistillData

    g = torch.Generator().manual_seed(1)
    prompts = [_tokens(g, vocab, 12, 28) for _ in range(rows)]
    completions = [_tokens(g, vocab, 4, tokens) for _ in range(rows)]
    sb = build_batch(prompts, completions, PAD_ID)
    model = load_model_weights_only(model_dir)
    with torch.no_grad():
        lp = completion_logprobs(model, sb, 1.0)
        rollout_lp = [lp[i, : len(c)].tolist() for i, c in enumerate(completions)]
        for p in model.parameters():  # the teacher: the same model, perturbed
            p.add_(0.02 * torch.randn(p.shape, generator=g))
        teacher_tokens = local_teacher_tokens(model, sb, stage.distill)
    samples = DistillSamples("math", prompts, completions, rollout_lp, 1.0)
    return [DistillData(samples, sb, teacher_tokens)]


def build_batch_file(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
    stage = stage_config()
    plan = synthetic_plan(args.prompts, args.group, args.tokens, vocab)
    distill = (
        [] if args.no_distill else synthetic_distill(args.model, args.prompts, args.tokens, vocab, stage)
    )
    torch.save({"plan": plan, "distill": distill}, path)
    return {
        "rl_sequences": len(plan.group_ids),
        "rl_completion_tokens": sum(len(c) for c in plan.completion_ids),
        "groups": args.prompts,
        "group_size": args.group,
        "max_completion_tokens": args.tokens,
        "distill": "none" if args.no_distill else f"sampled, {args.prompts} sequences, one teacher",
        "distill_completion_tokens": sum(len(c) for d in distill for c in d.samples.completion_ids),
    }


def load_batch(path: Path) -> tuple[Any, list[Any]]:
    data = torch.load(path, weights_only=False)
    return data["plan"], data["distill"]


def request(plan: Any) -> Any:
    from cascade.runner.update import UpdateRequest

    stage = stage_config()
    return UpdateRequest(
        rl=plan, stage=stage, stage_step=0, lr=stage.grpo.learning_rate, pad_id=PAD_ID, reference=None
    )


# --- what a rank holds -------------------------------------------------------------------------


def _nbytes(t: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's local bytes of parameters, gradients and optimizer state."""
    params = list(model.parameters())
    out = {
        "params": sum(_nbytes(p) for p in params),
        "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(
            _nbytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
        ),
    }
    out["total"] = sum(out.values())
    return out


def max_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _first(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in ("loss_rl", "loss_distill", "grad_norm") if k in metrics}


def one_rank(args: argparse.Namespace, batch: Path) -> dict[str, Any]:
    from cascade.accel import resolve_learner
    from cascade.config import LearnerConfig
    from cascade.runner.training import LocalTrainer

    plan, distill = load_batch(batch)
    req = request(plan)
    trainer = LocalTrainer(resolve_learner(LearnerConfig(device="cpu"), "float32"), "float32")
    trainer.load(args.model)
    trainer.start_stage(req.stage)
    assert trainer.optimizer is not None
    times, first = [], {}
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        metrics, _ = trainer.update(req, lambda: distill)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        if i == 0:
            first = _first(metrics)
    return {
        "ranks": 1,
        "torch_threads_per_rank": torch.get_num_threads(),
        "update_s": round(statistics.median(times), 4),
        "step_s": round(statistics.median(times), 4),
        "update_s_each": [round(t, 4) for t in times],
        "per_rank_bytes": [state_bytes(trainer.policy.model, trainer.optimizer)],
        "driver_full_copy_bytes": 0,
        "first_step": first,
        "max_rss_mb": [max_rss_mb()],
    }


def rank_worker(args: argparse.Namespace) -> int:
    """Under torchrun: every rank a `RankShard` on its share of the batch; rank 0 writes JSON."""
    import torch.distributed as dist

    from cascade.accel import resolve_learner
    from cascade.config import LearnerConfig
    from cascade.model.loading import load_policy
    from cascade.parallel.launch import start_rank
    from cascade.parallel.world import leave_world
    from cascade.runner.sharded import RankShard
    from cascade.runner.update import share_all

    assert args.rank_worker is not None
    batch, out = args.rank_worker / "batch.pt", args.rank_worker / "sharded.json"
    world, accel = start_rank(resolve_learner(LearnerConfig(device="cpu"), "float32"))
    try:
        plan, distill = load_batch(batch)
        req = request(plan)
        own = req.share(world.rank, world.size)
        own_distill = share_all(distill, world.rank, world.size, PAD_ID)
        shard = RankShard(world, accel, "float32")
        shard.load(args.model)
        shard.start_stage(req.stage.grpo.learning_rate, req.stage.grpo.weight_decay)
        assert shard.model is not None and shard.optimizer is not None
        driver_copy = load_policy(args.model, "float32").model if world.driver else None
        updates, steps, first = [], [], {}
        for i in range(args.warmup + args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            metrics, _ = shard.update(own, lambda: own_distill)
            t1 = time.perf_counter()
            full = shard.full_weights()
            if driver_copy is not None:
                driver_copy.load_state_dict(full)
            t2 = time.perf_counter()
            if i >= args.warmup:
                updates.append(t1 - t0)
                steps.append(t2 - t0)
            if i == 0:
                first = _first(metrics)
        mine = {
            "update": updates,
            "step": steps,
            "bytes": state_bytes(shard.model, shard.optimizer),
            "rss": max_rss_mb(),
            "threads": torch.get_num_threads(),
        }
        everyone: list[Any] = [None] * world.size
        dist.all_gather_object(everyone, mine)
        if world.driver:
            assert driver_copy is not None
            upd = [max(r["update"][i] for r in everyone) for i in range(args.steps)]
            stp = [max(r["step"][i] for r in everyone) for i in range(args.steps)]
            result = {
                "ranks": world.size,
                "torch_threads_per_rank": everyone[0]["threads"],
                "update_s": round(statistics.median(upd), 4),
                "step_s": round(statistics.median(stp), 4),
                "update_s_each": [round(t, 4) for t in upd],
                "per_rank_bytes": [r["bytes"] for r in everyone],
                "driver_full_copy_bytes": sum(_nbytes(p) for p in driver_copy.parameters()),
                "first_step": first,
                "max_rss_mb": [r["rss"] for r in everyone],
            }
            out.write_text(json.dumps(result))
    finally:
        leave_world()
    return 0


def sharded(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from cascade.parallel.launch import torchrun_argv

    flags = ["--rank-worker", str(work), "--model", str(args.model)]
    flags += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--threads", str(args.threads)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(args.threads)}
    argv = torchrun_argv(args.nproc, "bench.learner_scale", flags)
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(
            f"torchrun exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return dict(json.loads((work / "sharded.json").read_text()))


# --- the push ----------------------------------------------------------------------------------


def pushes(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "bench"))
    from weight_push import measure_push  # type: ignore[import-not-found]

    rows = []
    for size in filter(None, args.push_sizes.split(",")):
        hidden, layers = (int(x) for x in size.split("x"))
        one, two, size_mb = measure_push(tmp, hidden, layers, args.push_repeats)
        row = {
            "model": f"hidden {hidden}, {layers} layers",
            "checkpoint_mb": round(size_mb, 1),
            "one_replica_s": one["push_s"],
            "two_replicas_s": two["push_s"],
            "two_vs_one": round(two["push_s"] / one["push_s"], 2),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# --- main --------------------------------------------------------------------------------------


def model_info(path: Path) -> dict[str, Any]:
    cfg = json.loads((path / "config.json").read_text())
    try:
        shown = str(path.resolve().relative_to(ROOT))
    except ValueError:
        shown = str(path)
    return {
        "path": shown,
        "hidden": cfg["hidden_size"],
        "layers": cfg["num_hidden_layers"],
        "vocab": cfg["vocab_size"],
        "checkpoint_mb": round(sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20, 2),
    }


def learner_cases(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The batch's description and the 1-rank and `--nproc`-rank measurements on `args.model`."""
    work.mkdir(parents=True)
    batch_info = build_batch_file(args, work / "batch.pt")
    cases = [one_rank(args, work / "batch.pt")]
    if args.nproc > 1:
        cases.append(sharded(args, work))
    for c in cases:
        print(json.dumps({k: c[k] for k in ("ranks", "update_s", "step_s", "per_rank_bytes")}), flush=True)
    return batch_info, cases


def ratios(cases: list[dict[str, Any]]) -> dict[str, Any]:
    one_total = cases[0]["per_rank_bytes"][0]["total"]
    return {
        "per_rank_total_vs_one_rank": {
            str(c["ranks"]): [round(b["total"] / one_total, 4) for b in c["per_rank_bytes"]] for c in cases
        },
        "step_time_vs_one_rank": {str(c["ranks"]): round(c["step_s"] / cases[0]["step_s"], 2) for c in cases},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.rank_worker is not None:
        return rank_worker(args)
    load_start = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-learner-scale-") as tmp_s:
        tmp = Path(tmp_s)
        batch_info, cases = learner_cases(args, tmp / "main")
        larger = []
        for size in filter(None, args.larger.split(",")):
            hidden, layers = (int(x) for x in size.split("x"))
            sys.path.insert(0, str(ROOT / "bench"))
            from model_services import random_model  # type: ignore[import-not-found]

            big = argparse.Namespace(**{**vars(args), "warmup": 1, "steps": args.larger_steps})
            big.model = random_model(tmp / f"learner-{size}", hidden=hidden, layers=layers, base=tmp / "base")
            larger.append(
                {
                    "model": {**model_info(big.model), "path": f"random Qwen3 ({size}), tiny tokenizer"},
                    "steps": big.steps,
                    "learner": learner_cases(big, tmp / size)[1],
                }
            )
        push_rows = pushes(args, tmp) if args.push_sizes else []
    result: dict[str, Any] = {
        "model": model_info(args.model),
        "batch": batch_info,
        "warmup": args.warmup,
        "steps": args.steps,
        "learner": cases,
        **ratios(cases),
        "larger_models": [{**row, **ratios(row["learner"])} for row in larger],
        "pushes": push_rows,
        "push_repeats": args.push_repeats,
        "machine": {
            "cores": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "platform": platform.platform(),
            "torch": torch.__version__,
            "note": "no GPU; gloo over loopback; the ranks share the cores",
        },
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

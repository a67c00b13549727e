"""Run under `torchrun --nproc-per-node 2` by tests/integration/test_sharded_learner.py.

Rank 0 drives a `ShardedTrainer` (the other rank follows it) and, in the same process, a
`LocalTrainer` on the same batches: three updates with RL (advantages, a KL reference, the
engine's log-probs with the behaviour correction `masked`, off, then `tis`: the mismatch metrics,
a maximum among them, over ranks) plus a distillation term (sampled, then top-k, then full),
then the two resharding directions through checkpoints (2 ranks -> 1 and 1 -> 2, the second
with `seq_mask`). Writes the largest differences to the JSON file named by
argv[3]; the test asserts on them.

With a fourth argument `micro`, every sharded update runs in micro-batches of a few sequences
with the vocabulary in chunks (each rank cuts its own share; the ranks run as many passes as the
largest share needs), against the one-pass local update.

argv: MODEL_DIR WORK_DIR OUT_JSON [micro]
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from cascade.accel import resolve_learner
from cascade.config import LearnerConfig, StageConfig
from cascade.distill.modes import local_teacher_tokens
from cascade.distill.samples import DistillSamples
from cascade.engine.batch import build_batch
from cascade.engine.microbatch import MicroBatching
from cascade.model.loading import load_model_weights_only
from cascade.parallel.launch import start_rank
from cascade.runner.distill import DistillData
from cascade.runner.rl import RlPlan
from cascade.runner.sharded import ShardedTrainer, follow_driver, release
from cascade.runner.training import LocalTrainer
from cascade.runner.update import UpdateRequest

LOSSES = ("sampled", "topk", "full")
MICRO = len(sys.argv) > 4 and sys.argv[4] == "micro"
CUT = MicroBatching(tokens=30, logits_chunk_bytes=4 * 384 * 6)


CORRECTION = {0: "masked", 2: "tis", 4: "seq_mask"}
"""The behaviour correction of each step (off elsewhere: the odd steps are stale, the engine's
log-probs the ratio's old policy)."""


def stage(loss: str, correction: str = "off") -> StageConfig:
    return StageConfig.model_validate(
        {
            "domain": "math",
            "grpo": {
                "kl_coef": 0.05,
                "learning_rate": 1e-4,
                "max_grad_norm": 0.5,
                "behaviour_correction": {"mode": correction, "seq_threshold": 1.5},
            },
            "distill": {"loss": loss, "topk": 6, "temperature": 0.9},
        }
    )


def plan(step: int) -> RlPlan:
    """Uneven groups (as after filtering), shared prompts within a group, ragged lengths."""
    g = torch.Generator().manual_seed(100 + step)
    sizes = [3, 4, 2, 4, 3]
    rows_prompt, rows_completion, groups = [], [], []
    for gid, size in enumerate(sizes):
        prompt = torch.randint(5, 200, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(size):
            n = int(torch.randint(1, 10, (1,), generator=g))
            rows_prompt.append(prompt)
            rows_completion.append(torch.randint(5, 200, (n,), generator=g).tolist())
            groups.append(gid)
    adv = torch.randn(len(groups), generator=g).tolist()
    old = [(-torch.rand(len(c), generator=g) * 4).tolist() for c in rows_completion]
    # the engine's: within a nat of the random tiny model's (about -5.9), ratios both sides of [0.5, 2]
    engine = [(-5.9 + torch.rand(len(c), generator=g) * 2 - 1).tolist() for c in rows_completion]
    return RlPlan(
        metrics={"reward_mean": 0.5},
        prompt_ids=rows_prompt,
        completion_ids=rows_completion,
        group_ids=groups,
        advantages=adv,
        old_logprobs=old if step % 2 else None,
        temperature=1.0,
        global_rows=len(groups),
        behaviour_logprobs=engine,
    )


def distill_data(teacher: Any, step: int, loss: str) -> list[DistillData]:
    g = torch.Generator().manual_seed(200 + step)
    prompts = [torch.randint(5, 200, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()]
    prompts = [p for p in prompts for _ in range(3)] + [[7, 8, 9]] * 2
    completions = [
        torch.randint(5, 200, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
        for _ in prompts
    ]
    samples = DistillSamples("if", prompts, completions, [[-1.0] * len(c) for c in completions], 1.0)
    sb = build_batch(prompts, completions, 0)
    return [DistillData(samples, sb, local_teacher_tokens(teacher, sb, stage(loss).distill))]


def request(step: int, reference: Path) -> UpdateRequest:
    loss = LOSSES[step % 3]
    return UpdateRequest(
        rl=plan(step),
        stage=stage(loss, CORRECTION.get(step, "off")),
        stage_step=step,
        lr=1e-4,
        pad_id=0,
        reference=reference,
    )


def weights_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


def sharded_request(req: UpdateRequest) -> UpdateRequest:
    return replace(req, batching=CUT) if MICRO else req


def metrics_diff(a: dict[str, float], b: dict[str, float]) -> tuple[float, list[str]]:
    cut = ("micro_batches", "padding_share")  # only a micro-batched step reports these
    b = {k: v for k, v in b.items() if not k.endswith(cut) or k in a}
    keys = sorted(k for k in a if isinstance(a[k], float))
    assert set(keys) == {k for k in b if isinstance(b[k], float)}, (sorted(a), sorted(b))
    return max(abs(a[k] - b[k]) / max(1.0, abs(a[k])) for k in keys), keys


def main() -> int:
    model, work, out_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    accel = resolve_learner(LearnerConfig(device="cpu"), "float32")
    world, accel = start_rank(accel)
    if not world.driver:
        return follow_driver(world, accel, "float32")
    try:
        teacher_dir = work / "teacher"
        teacher = load_model_weights_only(model)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in teacher.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        teacher.save_pretrained(teacher_dir)
        sharded, local = ShardedTrainer(world, accel, "float32"), LocalTrainer(accel, "float32")
        report: dict[str, Any] = {"steps": []}
        for trainer in (sharded, local):
            trainer.load(model)
            trainer.start_stage(stage("sampled"))
        gen_s = torch.Generator().manual_seed(0)
        for step in range(3):
            req = request(step, model)
            data = distill_data(teacher, step, LOSSES[step % 3])
            ms, _ = sharded.update(sharded_request(req), lambda d=data: d)
            ml, _ = local.update(req, lambda d=data: d)
            diff, keys = metrics_diff(ml, ms)
            report["steps"].append(
                {
                    "loss": LOSSES[step % 3],
                    "metric_diff": diff,
                    "weights_diff": weights_diff(local.policy.model, sharded.policy.model),
                    "keys": keys,
                    "grad_norm": [ml["grad_norm"], ms["grad_norm"]],
                    "loss_distill": [ml.get("loss_distill"), ms.get("loss_distill")],
                    "micro_batches": ms.get("micro_batches", 1.0),
                }
            )
        # 2 ranks -> 1: the sharded checkpoint resumed by one process, against the one that went on
        two = work / "ckpt-2ranks"
        sharded.save(two, generator=gen_s, runner_state={"step": 3})
        one_more = request(3, model)
        resumed = LocalTrainer(accel, "float32")
        resumed.load(two)
        resumed.start_stage(stage("sampled"))
        resumed.restore(two, optimizer=True, generator=torch.Generator())
        data = distill_data(teacher, 3, "sampled")
        mr, _ = resumed.update(one_more, lambda: data)
        ml, _ = local.update(one_more, lambda: data)
        report["two_to_one"] = {
            "metric_diff": metrics_diff(ml, mr)[0],
            "weights_diff": weights_diff(local.policy.model, resumed.policy.model),
            "sharded_files": sorted(p.name for p in (two / "dcp").iterdir()),
        }
        # 1 rank -> 2: the one-process checkpoint resumed by the sharded learner
        one = work / "ckpt-1rank"
        local.save(one, generator=gen_s, runner_state={"step": 4})
        sharded.load(one)
        sharded.start_stage(stage("sampled"))
        sharded.restore(one, optimizer=True, generator=torch.Generator())
        last = request(4, model)
        data = distill_data(teacher, 4, "topk")
        ms, _ = sharded.update(sharded_request(last), lambda: data)
        ml, _ = local.update(last, lambda: data)
        report["one_to_two"] = {
            "metric_diff": metrics_diff(ml, ms)[0],
            "weights_diff": weights_diff(local.policy.model, sharded.policy.model),
        }
        out_path.write_text(json.dumps(report, indent=1))
    finally:
        release(world)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One learner update as data, and the function every rank runs on its part of it.

The loop decides what a step trains on (`UpdateRequest`: the RL plan, the stage, the learning
rate, the KL reference); `run_update` does the forward passes, the backward passes, the
clipping and the optimizer step on whatever model it is given: the whole policy in one process,
or one rank's FSDP shard with `reduce` summing over the ranks. The distillation data arrives
after the RL term's forward pass (it may still be fetched in a thread meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from cascade.accel import Accel
from cascade.algo import schedule_value
from cascade.algo.masking import SumOverRanks
from cascade.config import StageConfig
from cascade.runner.distill import DistillData, distill_terms, share_distill
from cascade.runner.frozen_models import FrozenModelCache
from cascade.runner.optimizer_step import apply_update
from cascade.runner.rl import RlPlan, rl_loss


@dataclass
class UpdateRequest:
    rl: RlPlan
    stage: StageConfig
    stage_step: int
    """The step's index in its stage (the distillation weight's schedule reads it)."""
    lr: float
    pad_id: int
    reference: Path | None
    """The frozen stage-start policy for the k3 term, None without one."""

    def share(self, rank: int, size: int) -> UpdateRequest:
        return replace(self, rl=self.rl.share(rank, size))


def share_all(fetched: list[DistillData], rank: int, size: int, pad_id: int) -> list[DistillData]:
    return [share_distill(f, rank, size, pad_id) for f in fetched]


def run_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    req: UpdateRequest,
    distill: Callable[[], list[DistillData]],
    *,
    accel: Accel,
    frozen: FrozenModelCache,
    reduce: SumOverRanks | None = None,
) -> tuple[dict[str, float], float]:
    """The step's update; returns its metrics and the seconds its forward passes took."""
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)  # before the forward passes (see `apply_update`)
    g = req.stage.grpo
    ref = frozen.get("reference", req.reference) if req.reference is not None else None
    with accel.autocast():  # the loss's forward passes only (a no-op in float32)
        rl = rl_loss(model, req.rl, g, pad_id=req.pad_id, ref_model=ref, reduce=reduce)
    t_rl = time.perf_counter() - t0
    fetched = distill()
    t1 = time.perf_counter()
    with accel.autocast():
        terms, distill_metrics = distill_terms(model, fetched, req.stage, reduce)
    lam = schedule_value(req.stage.distill.lam, req.stage_step) if terms else 0.0
    forward_s = t_rl + time.perf_counter() - t1
    update = apply_update(
        model,
        optimizer,
        rl=rl,
        distill=terms,
        lam=lam,
        max_grad_norm=g.max_grad_norm,
        lr=req.lr,
        reduce=reduce,
    )
    return {**rl.metrics, **distill_metrics, **update}, forward_s

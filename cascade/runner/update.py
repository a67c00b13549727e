"""One learner update as data, and the function every rank runs on its part of it.

The loop decides what a step trains on (`UpdateRequest`: the RL plan, the stage, the learning
rate, the KL reference); `run_update` does the forward passes, the backward passes, the
clipping and the optimizer step on whatever model it is given: the whole policy in one process,
or one rank's FSDP shard with `reduce` summing over the ranks. The distillation data arrives
after the RL term's forward pass (it may still be fetched in a thread meanwhile).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from cascade.accel import Accel
from cascade.algo import schedule_value
from cascade.algo.masking import MaxOverRanks, SumOverRanks
from cascade.config import StageConfig
from cascade.engine.microbatch import MicroBatching
from cascade.runner.distill import DistillData, distill_backward, distill_terms, share_distill
from cascade.runner.frozen_models import FrozenModelCache
from cascade.runner.optimizer_step import LossTerm, TermGradients, apply_update
from cascade.runner.rl import RlPlan, rl_backward, rl_loss


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
    batching: MicroBatching = field(default_factory=MicroBatching)
    """How the step is cut to fit (`learner.micro_batch_tokens`, ...)."""

    def share(self, rank: int, size: int) -> UpdateRequest:
        return replace(self, rl=self.rl.share(rank, size))


def share_request(req: UpdateRequest, size: int) -> list[UpdateRequest]:
    """Every rank's share of `req`, each to run as many micro-batches as the largest share needs
    (an FSDP2 model's forward and backward passes are collectives: the ranks' must pair up)."""
    shares = [req.share(r, size) for r in range(size)]
    most = max(len(s.rl.spans(req.batching)) for s in shares)
    return [replace(s, rl=replace(s.rl, micro_batches=most)) for s in shares]


def share_all(
    fetched: list[DistillData], rank: int, size: int, pad_id: int, batching: MicroBatching | None = None
) -> list[DistillData]:
    """Rank `rank`'s share of each teacher's data; with `batching`, each to run as many
    micro-batches as that teacher's largest share needs (see `share_request`)."""
    out = []
    for f in fetched:
        mine = share_distill(f, rank, size, pad_id)
        if batching is not None:
            shares = [share_distill(f, r, size, pad_id) for r in range(size)]
            mine.micro_batches = max(len(s.spans(batching)) for s in shares)
        out.append(mine)
    return out


@contextlib.contextmanager
def training_mode(model: PreTrainedModel, batching: MicroBatching) -> Iterator[None]:
    """With activation checkpointing, the model's decoder layers recompute their activations in
    the backward (the model's own gradient checkpointing, which acts in training mode only): on
    for the update's passes, off again after (generation keeps its KV cache)."""
    if not batching.activation_checkpointing:
        yield
        return
    was_training = model.training
    # transformers 5 names it activation checkpointing (the old names are deprecated)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        disable = model.activation_checkpointing_disable
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        disable = model.gradient_checkpointing_disable
    model.train()
    try:
        yield
    finally:
        model.train(was_training)
        disable()


def run_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    req: UpdateRequest,
    distill: Callable[[], list[DistillData]],
    *,
    accel: Accel,
    frozen: FrozenModelCache,
    reduce: SumOverRanks | None = None,
    reduce_max: MaxOverRanks | None = None,
) -> tuple[dict[str, float], float]:
    """The step's update; returns its metrics and the seconds its forward passes took (with
    their backward passes, when the step runs in micro-batches).

    A step whose every term fits one forward (`learner.micro_batch_tokens` unset, or above the
    step) runs each term's forward, then the backward passes: as it always did. Otherwise each
    term runs forward and backward micro-batch by micro-batch, its normalisers the step's.

    `reduce` sums over the ranks, `reduce_max` takes their maximum (for the metrics that are
    maxima); a sharded learner gives both."""
    with training_mode(model, req.batching):
        return _run_update(
            model, optimizer, req, distill, accel=accel, frozen=frozen, reduce=reduce, reduce_max=reduce_max
        )


def _run_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    req: UpdateRequest,
    distill: Callable[[], list[DistillData]],
    *,
    accel: Accel,
    frozen: FrozenModelCache,
    reduce: SumOverRanks | None,
    reduce_max: MaxOverRanks | None,
) -> tuple[dict[str, float], float]:
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)  # before the forward passes (see `apply_update`)
    g = req.stage.grpo
    ref = frozen.get("reference", req.reference) if req.reference is not None else None
    rl: LossTerm | None = None
    if req.rl.in_one_pass(req.batching):
        with accel.autocast():  # the loss's forward passes only (a no-op in float32)
            rl = rl_loss(
                model,
                req.rl,
                g,
                pad_id=req.pad_id,
                ref_model=ref,
                reduce=reduce,
                chunk_bytes=req.batching.logits_chunk_bytes,
                reduce_max=reduce_max,
            )
        rl_value, rl_metrics = None, rl.metrics
    else:
        rl_value, rl_metrics = rl_backward(
            model,
            req.rl,
            g,
            pad_id=req.pad_id,
            batching=req.batching,
            autocast=accel.autocast,
            ref_model=ref,
            reduce=reduce,
            reduce_max=reduce_max,
        )
    t_rl = time.perf_counter() - t0
    fetched = distill()
    t1 = time.perf_counter()
    lam = schedule_value(req.stage.distill.lam, req.stage_step) if fetched else 0.0
    if rl is not None and all(f.in_one_pass(req.batching) for f in fetched):
        with accel.autocast():
            terms, one_pass_metrics = distill_terms(model, fetched, req.stage, reduce)
        lam = lam if terms else 0.0
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
        return {**rl.metrics, **one_pass_metrics, **update}, forward_s
    if rl is not None and rl.loss is not None:  # its forward ran in one pass: its backward now
        rl.loss.backward()
        rl_value = float((reduce or (lambda t: t))(rl.loss.detach()))
    grads = TermGradients(model, reduce, rl_value, then_distill=bool(fetched) and lam > 0)
    distill_value: float | None = None
    distill_metrics: dict[str, float] = {}
    for f in fetched:
        w = req.stage.distill.teacher_weights.get(f.samples.teacher, 1.0)
        value, metrics = distill_backward(
            model,
            f,
            req.stage,
            scale=lam * w,
            pad_id=req.pad_id,
            batching=req.batching,
            autocast=accel.autocast,
            reduce=reduce,
        )
        distill_metrics.update(metrics)
        if lam > 0:
            distill_value = (distill_value or 0.0) + w * value
    forward_s = t_rl + time.perf_counter() - t1
    update = grads.step(optimizer, distill_value, lam=lam, max_grad_norm=g.max_grad_norm, lr=req.lr)
    return {**rl_metrics, **distill_metrics, **update}, forward_s

"""One learner update from its loss terms: `L = L_RL + lambda(t) * sum_d w_d * L_distill(d)`.

The two terms are backpropagated one after the other so the gradient norm of each is measured
(their ratio tells whether distillation or RL dominates the update), then the gradient is
clipped (over every rank's shards for a sharded model) and the optimizer steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from cascade.algo.masking import SumOverRanks
from cascade.engine.batch import SequenceBatch, build_batch


@dataclass
class LossTerm:
    loss: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


def placeholder_batch(pad_id: int) -> SequenceBatch:
    """One padding token with nothing counted: the forward pass of a rank whose share of a term
    is empty (every rank of a sharded model must run each forward and backward together)."""
    sb = build_batch([[pad_id]], [[pad_id]], pad_id)
    sb.completion_mask.zero_()
    return sb


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) parameter or gradient; a plain tensor as is."""
    return t.to_local() if isinstance(t, DTensor) else t


def _grad_snapshot(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [
        _local(p.grad).detach().clone() if p.grad is not None else torch.zeros_like(_local(p)) for p in params
    ]


def _grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """The local gradients themselves (zeros where there is none), not copies."""
    return [_local(p.grad) if p.grad is not None else torch.zeros_like(_local(p)) for p in params]


def _norm_of_differences(
    a: list[torch.Tensor], b: list[torch.Tensor], reduce: SumOverRanks | None = None
) -> float:
    """`_norm([x - y ...])`, each difference made and dropped in turn."""
    squares = torch.stack([((x - y).float() ** 2).sum() for x, y in zip(a, b, strict=True)]).sum()
    return float(torch.sqrt(squares if reduce is None else reduce(squares)))


def _norm(tensors: list[torch.Tensor], reduce: SumOverRanks | None = None) -> float:
    squares = torch.stack([(t.float() ** 2).sum() for t in tensors]).sum()
    return float(torch.sqrt(squares if reduce is None else reduce(squares)))


def _clip_sharded(params: list[torch.nn.Parameter], max_norm: float, reduce: SumOverRanks) -> float:
    """`clip_grad_norm_` over gradients sharded across ranks: the norm of the whole gradient
    (every rank's shards), the same scale applied on every rank."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    total = _norm(grads, reduce)
    scale = min(max_norm / (total + 1e-6), 1.0)
    for g in grads:
        g.mul_(scale)
    return total


def apply_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    *,
    rl: LossTerm,
    distill: list[tuple[float, LossTerm]],
    lam: float,
    max_grad_norm: float,
    lr: float,
    reduce: SumOverRanks | None = None,
) -> dict[str, float]:
    """Backpropagate both terms, clip, step. Returns gradient-norm metrics. With `reduce`, the
    model is sharded and each term is this rank's part of the global loss: norms, clipping and
    the reported losses are over all ranks."""
    total = reduce or (lambda t: t)
    if reduce is None:
        # A sharded model's gradients are cleared before its forward passes (`run_update`):
        # after a forward, FSDP2's root holds unsharded parameters, and clearing those would
        # leave the sharded gradients of the last step to accumulate into this one.
        optimizer.zero_grad(set_to_none=True)
    rl_value = None
    if rl.loss is not None:
        rl.loss.backward()
        rl_value = float(total(rl.loss.detach()))
    distill_losses = [w * term.loss for w, term in distill if term.loss is not None]
    grads = TermGradients(model, reduce, rl_value, then_distill=bool(distill_losses) and lam > 0)
    distill_value = None
    if distill_losses and lam > 0:
        total_distill = torch.stack(distill_losses).sum()
        (lam * total_distill).backward()
        distill_value = float(total(total_distill.detach()))
    return grads.step(optimizer, distill_value, lam=lam, max_grad_norm=max_grad_norm, lr=lr)


def trained_parameters(model: PreTrainedModel) -> list[torch.nn.Parameter]:
    # read after each backward: between a forward and its backward, FSDP2's root module
    # holds unsharded parameters in place of the sharded ones the optimizer updates
    return [p for p in model.parameters() if p.requires_grad]


class TermGradients:
    """The step's gradient, term by term: made once the RL term's backward passes are done (its
    gradient is then all the parameters hold, and is kept to tell the distillation term's
    apart), `step` once the distillation terms' are. Both norms are measured (their ratio says
    which term dominates the update), then the whole gradient is clipped and the optimizer steps."""

    def __init__(
        self,
        model: PreTrainedModel,
        reduce: SumOverRanks | None,
        rl_loss: float | None,
        *,
        then_distill: bool,
    ) -> None:
        """`then_distill`: whether distillation terms will be backpropagated (only then is the RL
        term's gradient copied: one float32 copy of the model, per rank)."""
        self.model = model
        self.reduce = reduce
        self.rl_loss = rl_loss
        self.rl_norm = 0.0
        self.rl_grads: list[torch.Tensor] | None = None
        if rl_loss is not None:
            params = trained_parameters(model)
            grads = _grad_snapshot(params) if then_distill else _grads(params)
            self.rl_norm = _norm(grads, reduce)
            self.rl_grads = grads if then_distill else None

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        distill_loss: float | None,
        *,
        lam: float,
        max_grad_norm: float,
        lr: float,
    ) -> dict[str, float]:
        """`distill_loss`: the distillation terms' value (weighted, before lambda), None when they
        were not backpropagated (no term, or lambda 0)."""
        reduce = self.reduce
        metrics: dict[str, float] = {"lr": lr, "lambda": lam}
        if self.rl_loss is not None:
            metrics["loss_rl"] = self.rl_loss
        if distill_loss is not None:
            after = _grads(trained_parameters(self.model))
            rl_grads, self.rl_grads = self.rl_grads, None
            if rl_grads is None:
                d_norm = _norm(after, reduce)
            else:  # one parameter's difference at a time: no second copy of the model
                d_norm = _norm_of_differences(after, rl_grads, reduce)
                del rl_grads
            metrics["loss_distill"] = distill_loss
            metrics["grad_norm_distill"] = d_norm
            if self.rl_norm > 0:
                metrics["grad_norm_ratio_distill_rl"] = d_norm / self.rl_norm
        metrics["grad_norm_rl"] = self.rl_norm
        if self.rl_loss is None and distill_loss is None:
            metrics["skipped_update"] = 1.0
            return metrics
        for group in optimizer.param_groups:
            group["lr"] = lr
        params = trained_parameters(self.model)
        if reduce is None:
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        else:
            metrics["grad_norm"] = _clip_sharded(params, max_grad_norm, reduce)
        optimizer.step()
        metrics["skipped_update"] = 0.0
        return metrics


def divide_term_gradient(model: PreTrainedModel, before: list[torch.Tensor], divisor: float) -> None:
    """Divide what the last term added to the gradients (`grad - before`) by `divisor`: a term
    whose normaliser was known only after its last micro-batch's forward."""
    for p, b in zip(trained_parameters(model), before, strict=True):
        if p.grad is None:
            continue
        g = _local(p.grad)
        g.sub_(b).div_(divisor).add_(b)


def gradient_snapshot(model: PreTrainedModel) -> list[torch.Tensor]:
    """A copy of every trained parameter's local gradient (zeros where there is none)."""
    return _grad_snapshot(trained_parameters(model))

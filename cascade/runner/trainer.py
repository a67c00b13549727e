"""One learner update: the GRPO term on scored groups plus the distillation term.

`L = L_RL + lambda(t) * sum_d w_d * L_distill(d)`. The two terms are backpropagated one after
the other so the gradient norm of each is measured (their ratio tells whether distillation
or RL dominates the update).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from cascade.algo import (
    FullDistillInput,
    GrpoLossInput,
    SampledDistillInput,
    TopkDistillInput,
    full_distill_loss,
    group_advantages,
    grpo_loss,
    sampled_distill_loss,
    topk_distill_loss,
    zero_variance_mask,
)
from cascade.algo.masking import SumOverRanks
from cascade.algo.turn_mask import TurnLayout, model_token_mask
from cascade.config import DistillConfig, GrpoConfig
from cascade.engine.batch import SequenceBatch, build_batch
from cascade.engine.logprobs import completion_logits, completion_logprobs, gather_logprobs
from cascade.engine.scoring import SequenceScores
from cascade.rollout.requests import RolloutBatch
from cascade.tools.turn_loop import turn_metrics


@dataclass
class LossTerm:
    loss: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


def _padded_logprobs(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row[:width])
    return out


class VerifierFailureError(RuntimeError):
    """A step whose share of failed-verifier (`infra_error`) samples passed the configured
    bound (`grpo.max_verifier_failure_fraction`): training on the rest would learn from noise,
    so the stage should stop. `causes` are the most frequent infra-error details, with counts."""

    def __init__(
        self, fraction: float, bound: float, n_failed: int, n_total: int, causes: list[tuple[str, int]]
    ) -> None:
        self.fraction = fraction
        self.bound = bound
        self.n_failed = n_failed
        self.n_total = n_total
        self.causes = causes
        top = "; ".join(f"{n}x {detail or '(no detail)'}" for detail, n in causes) or "none recorded"
        super().__init__(
            f"verifier failed on {n_failed} of {n_total} samples ({fraction:.1%}), above the bound "
            f"max_verifier_failure_fraction={bound:g}; top causes: {top}"
        )


def check_verifier_failures(batch: RolloutBatch, bound: float, *, top: int = 3) -> float:
    """The step's share of failed-verifier samples; raises `VerifierFailureError` above `bound`."""
    failed = [v.detail for v in batch.verdicts if v.is_infra_error]
    total = len(batch.verdicts)
    fraction = len(failed) / total if total else 0.0
    if fraction > bound:
        causes = Counter(detail[:200] for detail in failed).most_common(top)
        raise VerifierFailureError(fraction, bound, len(failed), total, causes)
    return fraction


@dataclass
class RlPlan:
    """The RL term's rows, chosen from the whole batch before any forward pass (advantages and
    the zero-variance filter need every group): each kept sequence with its group, advantage and
    behaviour log-probs. `metrics` describe the whole batch. A sharded learner gives each rank a
    `share` of whole groups."""

    metrics: dict[str, float]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    group_ids: list[int]
    advantages: list[float]
    old_logprobs: list[list[float]] | None
    """None: the batch is on-policy (made by the weights being trained)."""
    temperature: float
    global_rows: int
    """Rows of the whole plan (a share's own rows may be none while other ranks have some)."""
    layouts: list[TurnLayout] | None = None
    """Multi-turn rows: only the model's tokens are trained (`model_token_mask`)."""

    @property
    def empty(self) -> bool:
        return not self.group_ids

    def share(self, rank: int, size: int) -> RlPlan:
        """Rank `rank`'s part of the rows: a contiguous block of whole groups (groups differ in
        size after filtering, so blocks are cut by group, never inside one)."""
        groups = sorted(set(self.group_ids))
        mine = set(groups[len(groups) * rank // size : len(groups) * (rank + 1) // size])
        rows = [i for i, gid in enumerate(self.group_ids) if gid in mine]
        return RlPlan(
            metrics=self.metrics,
            prompt_ids=[self.prompt_ids[i] for i in rows],
            completion_ids=[self.completion_ids[i] for i in rows],
            group_ids=[self.group_ids[i] for i in rows],
            advantages=[self.advantages[i] for i in rows],
            old_logprobs=None if self.old_logprobs is None else [self.old_logprobs[i] for i in rows],
            temperature=self.temperature,
            global_rows=self.global_rows,
            layouts=None if self.layouts is None else [self.layouts[i] for i in rows],
        )


def plan_rl(
    batch: RolloutBatch, cfg: GrpoConfig, *, current_version: int, drop_zero_variance: bool
) -> RlPlan:
    """Which sequences the GRPO term trains on, with their advantages.

    Samples whose verifier failed take no part in their group's statistics and get no
    gradient; a step with more of them than `cfg.max_verifier_failure_fraction` raises
    `VerifierFailureError` before any forward pass.
    """
    g = batch.group_size
    failure_fraction = check_verifier_failures(batch, cfg.max_verifier_failure_fraction)
    rewards = batch.rewards()  # [N, G]
    valid = batch.valid_mask()  # [N*G]
    adv = group_advantages(rewards, valid.view_as(rewards)).flatten()  # [N*G]
    zero_var = zero_variance_mask(rewards, valid.view_as(rewards))  # [N]
    keep = valid.clone()
    if drop_zero_variance:
        keep &= (~zero_var).repeat_interleave(g)
    if cfg.overlong == "mask":
        keep &= ~batch.truncated_mask()
    valid_rewards = rewards.flatten()[valid]
    metrics = {
        "reward_mean": float(valid_rewards.mean()) if valid_rewards.numel() else 0.0,
        "verifier_failure_fraction": failure_fraction,
        "zero_variance_groups": float(zero_var.float().mean()),
        "truncated_fraction": float(batch.truncated_mask().float().mean()),
        "completion_tokens_mean": sum(len(c) for c in batch.completion_ids) / len(batch.completion_ids),
        "kept_sequences": float(keep.sum()),
        **(
            {"model_tokens_mean": sum(lay.n_model for lay in batch.layouts) / len(batch.layouts)}
            if batch.layouts
            else {}
        ),
        **turn_metrics(batch.episodes),
        "staleness": float(current_version - batch.policy_version),
    }
    idx = torch.nonzero(keep).flatten().tolist()
    return RlPlan(
        metrics=metrics,
        prompt_ids=[batch.prompt_ids[i] for i in idx],
        completion_ids=[batch.completion_ids[i] for i in idx],
        group_ids=[i // g for i in idx],
        advantages=adv[idx].tolist(),
        old_logprobs=None if batch.policy_version == current_version else [batch.logprobs[i] for i in idx],
        temperature=batch.temperature,
        global_rows=len(idx),
        layouts=[batch.layouts[i] for i in idx] if batch.layouts else None,
    )


def placeholder_batch(pad_id: int) -> SequenceBatch:
    """One padding token with nothing counted: the forward pass of a rank whose share of a term
    is empty (every rank of a sharded model must run each forward and backward together)."""
    sb = build_batch([[pad_id]], [[pad_id]], pad_id)
    sb.completion_mask.zero_()
    return sb


def rl_loss(
    model: PreTrainedModel,
    plan: RlPlan,
    cfg: GrpoConfig,
    *,
    pad_id: int,
    ref_model: PreTrainedModel | None = None,
    reduce: SumOverRanks | None = None,
) -> LossTerm:
    """GRPO loss over `plan`'s rows; None when the plan is empty (nothing to learn from).

    With `reduce` the plan is one rank's share: every rank must call this, empty share or not."""
    metrics = dict(plan.metrics)
    if plan.global_rows == 0:
        return LossTerm(None, metrics)
    device = model.device  # every tensor of the loss lives where the model does
    if plan.empty:
        sb = placeholder_batch(pad_id).to(device)
        advantages, group_ids = torch.zeros(1), torch.zeros(1, dtype=torch.long)
    else:
        sb = build_batch(plan.prompt_ids, plan.completion_ids, pad_id)
        if plan.layouts is not None:  # the environment's tokens are context, never trained
            sb.completion_mask = model_token_mask(plan.layouts, sb.completion_mask).float()
        sb = sb.to(device)
        advantages, group_ids = torch.tensor(plan.advantages), torch.tensor(plan.group_ids)
    logp = completion_logprobs(model, sb, plan.temperature)
    width = sb.completion_ids.shape[1]
    old = None
    if plan.old_logprobs is not None:
        rows = plan.old_logprobs if not plan.empty else [[0.0]]
        old = _padded_logprobs(rows, width).to(device)
    ref = None
    if cfg.kl_coef > 0 and ref_model is not None:
        with torch.no_grad():
            ref = completion_logprobs(ref_model, sb, plan.temperature)
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logp,
            advantages=advantages.to(device),
            mask=sb.completion_mask,
            group_ids=group_ids.to(device),
            old_logprobs=old,
            ref_logprobs=ref,
            aggregation=cfg.loss_aggregation,
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            kl_coef=cfg.kl_coef,
            reduce=reduce,
        )
    )
    metrics.update({f"grpo_{k}": v for k, v in out.metrics.items()})
    return LossTerm(out.loss, metrics)


def rl_term(
    model: PreTrainedModel,
    batch: RolloutBatch,
    cfg: GrpoConfig,
    *,
    pad_id: int,
    current_version: int,
    drop_zero_variance: bool,
    ref_model: PreTrainedModel | None = None,
) -> LossTerm:
    """GRPO loss over the groups of `batch` that carry signal (`plan_rl`, then `rl_loss`)."""
    plan = plan_rl(batch, cfg, current_version=current_version, drop_zero_variance=drop_zero_variance)
    return rl_loss(model, plan, cfg, pad_id=pad_id, ref_model=ref_model)


@dataclass
class DistillSamples:
    """Student completions on a teacher's prompts (generated by the current policy)."""

    teacher: str
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    rollout_logprobs: list[list[float]]
    """One per completion token (multi-turn: the engine's at the model's tokens, 0.0 elsewhere)."""
    temperature: float
    layouts: list[TurnLayout] | None = None
    """Multi-turn episodes (an agent teacher's prompts): only the student's own tokens are
    distilled; the environment's are context for the student and the teacher alike."""

    def rows(self, lo: int, hi: int) -> DistillSamples:
        return DistillSamples(
            self.teacher,
            self.prompt_ids[lo:hi],
            self.completion_ids[lo:hi],
            self.rollout_logprobs[lo:hi],
            self.temperature,
            None if self.layouts is None else self.layouts[lo:hi],
        )


def distill_batch(samples: DistillSamples, pad_id: int) -> SequenceBatch:
    """The distillation batch's layout: every token is in the forward pass (the attention mask),
    but the completion mask, which every distillation loss and metric counts, holds only the
    student's own tokens when the samples are multi-turn (`model_token_mask`)."""
    sb = build_batch(samples.prompt_ids, samples.completion_ids, pad_id)
    if samples.layouts is not None:
        sb.completion_mask = model_token_mask(samples.layouts, sb.completion_mask).float()
    return sb


@dataclass
class TeacherTokens:
    """A teacher's view of the distillation batch, on its `build_batch` layout (B sequences,
    C completion positions; padding positions are 0). Which fields are set depends on the loss:

    - sampled: `logprobs` [B, C] at the distillation temperature;
    - full: `logits` [B, C, V] (logits or T=1 log-probs: the loss only uses their softmax);
    - topk: `topk_ids`, `topk_logprobs` [B, C, k] at T=1, and `logprobs_t1` [B, C] for the
      reverse-KL metric.
    """

    logprobs: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    logprobs_t1: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> TeacherTokens:
        """The tokens on `device` (the same tensors when they are there already)."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return TeacherTokens(
            logprobs=move(self.logprobs),
            logits=move(self.logits),
            topk_ids=move(self.topk_ids),
            topk_logprobs=move(self.topk_logprobs),
            logprobs_t1=move(self.logprobs_t1),
        )

    def rows(self, lo: int, hi: int, width: int) -> TeacherTokens:
        """Sequences `lo:hi`, cut to `width` completion positions (a share's own layout; the
        cut positions are padding for every one of its rows)."""

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[lo:hi, :width].contiguous()

        return TeacherTokens(
            logprobs=cut(self.logprobs),
            logits=cut(self.logits),
            topk_ids=cut(self.topk_ids),
            topk_logprobs=cut(self.topk_logprobs),
            logprobs_t1=cut(self.logprobs_t1),
        )


@torch.no_grad()
def local_teacher_tokens(teacher: PreTrainedModel, sb: SequenceBatch, cfg: DistillConfig) -> TeacherTokens:
    """The teacher's tokens computed in this process (embedded mode), on the teacher's device."""
    sb = sb.to(teacher.device)
    if cfg.loss == "sampled":
        return TeacherTokens(logprobs=completion_logprobs(teacher, sb, cfg.temperature))
    logits = completion_logits(teacher, sb, 1.0)
    if cfg.loss == "full":
        return TeacherTokens(logits=logits)
    k = min(cfg.topk, logits.shape[-1])
    # Untempered (T = 1) log-probs: topk_distill_loss applies T itself (tempering here
    # too would put the teacher at T^2).
    top_lp, top_ids = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
    return TeacherTokens(
        topk_ids=top_ids, topk_logprobs=top_lp, logprobs_t1=gather_logprobs(logits, sb.completion_ids)
    )


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """[n_i, ...] rows -> [B, width, ...], zero-padded."""
    out = torch.zeros((len(rows), width, *rows[0].shape[1:]), dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row[:width]
    return out


def remote_teacher_tokens(
    scores: list[SequenceScores],
    sb: SequenceBatch,
    cfg: DistillConfig,
    t1: list[SequenceScores] | None = None,
) -> TeacherTokens:
    """The teacher service's answer (`scores`, in the mode the loss needs; `t1`: sampled-mode
    scores at T=1, for the top-k loss's reverse-KL metric) on the learner's batch layout."""
    width = sb.completion_ids.shape[1]

    def pad(name: str, rows: list[SequenceScores]) -> torch.Tensor:
        values = [getattr(r, name) for r in rows]
        if any(v is None for v in values):
            raise ValueError(f"teacher reply lacks {name} for a {cfg.loss} loss")
        return _pad_rows(values, width)

    if cfg.loss == "sampled":
        return TeacherTokens(logprobs=pad("logprobs", scores))
    if cfg.loss == "full":
        return TeacherTokens(logits=pad("full_logprobs", scores))
    return TeacherTokens(
        topk_ids=pad("topk_ids", scores).long(),
        topk_logprobs=pad("topk_logprobs", scores),
        logprobs_t1=pad("logprobs", t1) if t1 is not None else None,
    )


def distill_term(
    model: PreTrainedModel,
    teacher: PreTrainedModel,
    samples: DistillSamples,
    cfg: DistillConfig,
    *,
    pad_id: int,
) -> LossTerm:
    sb = distill_batch(samples, pad_id)
    return distill_loss_term(model, sb, local_teacher_tokens(teacher, sb, cfg), samples, cfg)


def distill_loss_term(
    model: PreTrainedModel,
    sb: SequenceBatch,
    teacher: TeacherTokens,
    samples: DistillSamples,
    cfg: DistillConfig,
    reduce: SumOverRanks | None = None,
) -> LossTerm:
    """The distillation loss of the student (`model`) against a teacher's tokens, computed on the
    student's device (the batch and the teacher's tokens are moved there). With `reduce`, the
    rows are one rank's share and the loss and metrics are global (see `SumOverRanks`)."""
    device = model.device
    sb, teacher = sb.to(device), teacher.to(device)
    t = cfg.temperature
    if cfg.loss == "sampled":
        assert teacher.logprobs is not None
        student = completion_logprobs(model, sb, t)
        rollout = None
        if abs(samples.temperature - t) < 1e-9:
            rollout = _padded_logprobs(samples.rollout_logprobs, sb.completion_ids.shape[1]).to(device)
        out = sampled_distill_loss(
            SampledDistillInput(
                student_logprobs=student,
                teacher_logprobs=teacher.logprobs,
                mask=sb.completion_mask,
                rollout_logprobs=rollout,
                reduce=reduce,
            )
        )
    else:
        student_logits = completion_logits(model, sb, 1.0)
        teacher_lp: torch.Tensor | None
        if cfg.loss == "full":
            assert teacher.logits is not None
            out = full_distill_loss(
                FullDistillInput(
                    student_logits=student_logits,
                    teacher_logits=teacher.logits,
                    mask=sb.completion_mask,
                    temperature=t,
                    reduce=reduce,
                )
            )
            teacher_lp = gather_logprobs(teacher.logits, sb.completion_ids)
        else:
            assert teacher.topk_ids is not None and teacher.topk_logprobs is not None
            out = topk_distill_loss(
                TopkDistillInput(
                    student_logits=student_logits,
                    teacher_topk_ids=teacher.topk_ids,
                    teacher_topk_logprobs=teacher.topk_logprobs,
                    mask=sb.completion_mask,
                    temperature=t,
                    reduce=reduce,
                )
            )
            teacher_lp = teacher.logprobs_t1
        if teacher_lp is not None:
            with torch.no_grad():
                student_lp = gather_logprobs(student_logits, sb.completion_ids)
                m = sb.completion_mask
                # masked positions replaced, not multiplied: a teacher's value there is no input
                gap = torch.where(m > 0, student_lp - teacher_lp, torch.zeros_like(student_lp)).sum()
                if reduce is None:
                    kl = gap / m.sum().clamp(min=1)
                else:
                    kl = reduce(gap) / reduce(m.sum()).clamp(min=1)
                out.metrics["reverse_kl"] = float(kl)
    return LossTerm(out.loss, {f"distill_{samples.teacher}_{k}": v for k, v in out.metrics.items()})


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) parameter or gradient; a plain tensor as is."""
    return t.to_local() if isinstance(t, DTensor) else t


def _grad_snapshot(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [
        _local(p.grad).detach().clone() if p.grad is not None else torch.zeros_like(_local(p)) for p in params
    ]


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

    def trained() -> list[torch.nn.Parameter]:
        # read after each backward: between a forward and its backward, FSDP2's root module
        # holds unsharded parameters in place of the sharded ones the optimizer updates
        return [p for p in model.parameters() if p.requires_grad]

    if reduce is None:
        # A sharded model's gradients are cleared before its forward passes (`run_update`):
        # after a forward, FSDP2's root holds unsharded parameters, and clearing those would
        # leave the sharded gradients of the last step to accumulate into this one.
        optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, float] = {"lr": lr, "lambda": lam}
    rl_norm = 0.0
    rl_grads: list[torch.Tensor] | None = None
    if rl.loss is not None:
        rl.loss.backward()
        rl_grads = _grad_snapshot(trained())
        rl_norm = _norm(rl_grads, reduce)
        metrics["loss_rl"] = float(total(rl.loss.detach()))
    distill_losses = [w * term.loss for w, term in distill if term.loss is not None]
    if distill_losses and lam > 0:
        total_distill = torch.stack(distill_losses).sum()
        (lam * total_distill).backward()
        after = _grad_snapshot(trained())
        d_grads = after if rl_grads is None else [a - b for a, b in zip(after, rl_grads, strict=True)]
        d_norm = _norm(d_grads, reduce)
        metrics["loss_distill"] = float(total(total_distill.detach()))
        metrics["grad_norm_distill"] = d_norm
        if rl_norm > 0:
            metrics["grad_norm_ratio_distill_rl"] = d_norm / rl_norm
    metrics["grad_norm_rl"] = rl_norm
    if rl.loss is None and not (distill_losses and lam > 0):
        metrics["skipped_update"] = 1.0
        return metrics
    for group in optimizer.param_groups:
        group["lr"] = lr
    if reduce is None:
        metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(trained(), max_grad_norm))
    else:
        metrics["grad_norm"] = _clip_sharded(trained(), max_grad_norm, reduce)
    optimizer.step()
    metrics["skipped_update"] = 0.0
    return metrics

"""One learner update: the GRPO term on scored groups plus the distillation term.

`L = L_RL + lambda(t) * sum_d w_d * L_distill(d)`. The two terms are backpropagated one after
the other so the gradient norm of each is measured (their ratio tells whether distillation
or RL dominates the update).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
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
from cascade.config import DistillConfig, GrpoConfig
from cascade.engine.batch import SequenceBatch, build_batch
from cascade.engine.logprobs import completion_logits, completion_logprobs, gather_logprobs
from cascade.engine.scoring import SequenceScores
from cascade.rollout import RolloutBatch


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
    """GRPO loss over the groups of `batch` that carry signal.

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
        "staleness": float(current_version - batch.policy_version),
    }
    idx = torch.nonzero(keep).flatten().tolist()
    if not idx:
        return LossTerm(None, metrics)
    device = model.device  # every tensor of the loss lives where the model does
    sb = build_batch([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], pad_id)
    sb = sb.to(device)
    logp = completion_logprobs(model, sb, batch.temperature)
    width = sb.completion_ids.shape[1]
    old = None
    if batch.policy_version != current_version:
        old = _padded_logprobs([batch.logprobs[i] for i in idx], width).to(device)
    ref = None
    if cfg.kl_coef > 0 and ref_model is not None:
        with torch.no_grad():
            ref = completion_logprobs(ref_model, sb, batch.temperature)
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logp,
            advantages=adv[idx].to(device),
            mask=sb.completion_mask,
            group_ids=torch.tensor([i // g for i in idx]).to(device),
            old_logprobs=old,
            ref_logprobs=ref,
            aggregation=cfg.loss_aggregation,
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            kl_coef=cfg.kl_coef,
        )
    )
    metrics.update({f"grpo_{k}": v for k, v in out.metrics.items()})
    return LossTerm(out.loss, metrics)


@dataclass
class DistillSamples:
    """Student completions on a teacher's prompts (generated by the current policy)."""

    teacher: str
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    rollout_logprobs: list[list[float]]
    temperature: float


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
    sb: SequenceBatch = build_batch(samples.prompt_ids, samples.completion_ids, pad_id)
    return distill_loss_term(model, sb, local_teacher_tokens(teacher, sb, cfg), samples, cfg)


def distill_loss_term(
    model: PreTrainedModel,
    sb: SequenceBatch,
    teacher: TeacherTokens,
    samples: DistillSamples,
    cfg: DistillConfig,
) -> LossTerm:
    """The distillation loss of the student (`model`) against a teacher's tokens, computed on the
    student's device (the batch and the teacher's tokens are moved there)."""
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
                )
            )
            teacher_lp = teacher.logprobs_t1
        if teacher_lp is not None:
            with torch.no_grad():
                student_lp = gather_logprobs(student_logits, sb.completion_ids)
                m = sb.completion_mask
                kl = ((student_lp - teacher_lp) * m).sum() / m.sum().clamp(min=1)
                out.metrics["reverse_kl"] = float(kl)
    return LossTerm(out.loss, {f"distill_{samples.teacher}_{k}": v for k, v in out.metrics.items()})


def _grad_snapshot(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def _norm(tensors: list[torch.Tensor]) -> float:
    return float(torch.sqrt(torch.stack([(t.float() ** 2).sum() for t in tensors]).sum()))


def apply_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    *,
    rl: LossTerm,
    distill: list[tuple[float, LossTerm]],
    lam: float,
    max_grad_norm: float,
    lr: float,
) -> dict[str, float]:
    """Backpropagate both terms, clip, step. Returns gradient-norm metrics."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, float] = {"lr": lr, "lambda": lam}
    rl_norm = 0.0
    rl_grads: list[torch.Tensor] | None = None
    if rl.loss is not None:
        rl.loss.backward()
        rl_grads = _grad_snapshot(params)
        rl_norm = _norm(rl_grads)
        metrics["loss_rl"] = float(rl.loss.detach())
    distill_losses = [w * term.loss for w, term in distill if term.loss is not None]
    if distill_losses and lam > 0:
        total_distill = torch.stack(distill_losses).sum()
        (lam * total_distill).backward()
        after = _grad_snapshot(params)
        d_grads = after if rl_grads is None else [a - b for a, b in zip(after, rl_grads, strict=True)]
        d_norm = _norm(d_grads)
        metrics["loss_distill"] = float(total_distill.detach())
        metrics["grad_norm_distill"] = d_norm
        if rl_norm > 0:
            metrics["grad_norm_ratio_distill_rl"] = d_norm / rl_norm
    metrics["grad_norm_rl"] = rl_norm
    if rl.loss is None and not (distill_losses and lam > 0):
        metrics["skipped_update"] = 1.0
        return metrics
    for group in optimizer.param_groups:
        group["lr"] = lr
    metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    optimizer.step()
    metrics["skipped_update"] = 0.0
    return metrics

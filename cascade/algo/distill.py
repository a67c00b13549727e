"""On-policy distillation losses: keep an earlier domain's skills by matching its best checkpoint.

The student generates; a teacher scores the student's own tokens. Three wire formats, three
losses (docs/algorithm.md, "On-policy distillation"), all averaged over the counted tokens of `mask` [B, T]:

- `full`:    KL(teacher || student) over the whole vocabulary, both at temperature `T`, times
             `T^2` (Hinton's scaling keeps gradient size independent of `T`).
- `topk`:    the same with only the teacher's top-k log-probs. The teacher side is
             renormalised over its k ids; the student side is NOT: its log-probs come from the
             full-vocabulary `log_softmax` and are gathered at the k ids. The term is then
             `KL(p_hat || q_renorm) - log q(topk set)` >= 0, so it also pushes student mass into
             the teacher's top-k set; renormalising the student too would let it keep any mass
             outside the set for free. With k = V it equals `full` exactly.
- `sampled`: one float per token on the wire (MOPD, Nemotron-Cascade 2). The per-token
             advantage `a_t = sg(log p_teacher - log p_student)` (negative reverse KL) is used
             as a policy-gradient reward, so the gradient is the sampled reverse-KL gradient
             `E[(log p_s - log p_t) grad log p_s]`. Off-policy tokens are weighted by
             `w_t = sg(p_student / p_rollout)`; tokens with `w_t` outside `[0.5, 2.0]` are dropped
             (masked, not clipped) and the mean runs over the kept tokens.
Teacher inputs are detached: a teacher never receives gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from cascade.algo.masking import SumOverRanks, keep, masked_token_mean, token_mask


@dataclass(frozen=True)
class DistillLossOutput:
    """loss: scalar tensor. metrics: plain floats (keys listed on each loss function)."""

    loss: Tensor
    metrics: dict[str, float]


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _kl(teacher_lp: Tensor, student_lp: Tensor) -> Tensor:
    return (teacher_lp.exp() * (teacher_lp - student_lp)).sum(dim=-1)


def token_kl_loss(
    kl: Tensor,
    mask: Tensor,
    temperature: float,
    reduce: SumOverRanks | None = None,
    count: Tensor | None = None,
) -> DistillLossOutput:
    """`T^2 * mean(kl)` over the counted tokens of `mask` [B, T], from per-token KLs [B, T].

    `count`: the step's counted tokens (see `masked_token_mean`): the loss and `kl` are then
    these rows' parts of the step's, `n_tokens` their own count (all add up over micro-batches)."""
    m = token_mask(mask, kl.shape)
    kl_mean = masked_token_mean(kl, m, reduce, count)
    total = reduce or (lambda x: x)
    return DistillLossOutput(
        loss=kl_mean * temperature**2,
        metrics={"kl": float(total(kl_mean.detach()).item()), "n_tokens": float(total(m.sum()).item())},
    )


def full_token_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """Per-token `KL(softmax(teacher/T) || softmax(student/T))` over the last axis: [..., V] -> [...]."""
    student_lp = F.log_softmax(student_logits / temperature, dim=-1)
    teacher_lp = F.log_softmax(teacher_logits.detach() / temperature, dim=-1)
    return _kl(teacher_lp, student_lp)


def topk_token_kl(
    student_logits: Tensor, topk_ids: Tensor, topk_logprobs: Tensor, temperature: float
) -> Tensor:
    """Per-token top-k term (see `topk_distill_loss`): student logits [..., V], the teacher's k
    ids and T=1 log-probs [..., k] -> [...]."""
    student_lp = F.log_softmax(student_logits / temperature, dim=-1).gather(-1, topk_ids)
    teacher_hat = F.log_softmax(topk_logprobs.detach() / temperature, dim=-1)
    return _kl(teacher_hat, student_lp)


# --------------------------------------------------------------------------- full


@dataclass(frozen=True)
class FullDistillInput:
    """student_logits, teacher_logits: [B, T, V] raw logits; mask: [B, T]."""

    student_logits: Tensor
    teacher_logits: Tensor
    mask: Tensor
    temperature: float = 1.0
    reduce: SumOverRanks | None = None
    step_tokens: Tensor | None = None
    """The step's counted tokens when these rows are one micro-batch of it (`token_kl_loss`)."""

    def __post_init__(self) -> None:
        if self.student_logits.dim() != 3:
            raise ValueError(f"student_logits must be [B, T, V], got {tuple(self.student_logits.shape)}")
        if self.teacher_logits.shape != self.student_logits.shape:
            raise ValueError(
                f"teacher_logits {tuple(self.teacher_logits.shape)} != "
                f"student_logits {tuple(self.student_logits.shape)}"
            )
        token_mask(self.mask, self.student_logits.shape[:2])
        _check_temperature(self.temperature)


def full_distill_loss(inp: FullDistillInput) -> DistillLossOutput:
    """`T^2 * KL(softmax(teacher/T) || softmax(student/T))` per token, mean over counted tokens.

    Metrics: `kl` (mean per-token KL before the `T^2` factor), `n_tokens`.
    """
    m = token_mask(inp.mask, inp.student_logits.shape[:2])
    m3 = m.unsqueeze(-1)
    t = inp.temperature
    kl = full_token_kl(keep(inp.student_logits, m3), keep(inp.teacher_logits.detach(), m3), t)  # [B, T]
    return token_kl_loss(kl, m, t, inp.reduce, inp.step_tokens)


# --------------------------------------------------------------------------- top-k


@dataclass(frozen=True)
class TopkDistillInput:
    """student_logits: [B, T, V]; teacher_topk_ids: [B, T, k] long; teacher_topk_logprobs:
    [B, T, k] the teacher's log-probs at temperature 1 for those ids; mask: [B, T]."""

    student_logits: Tensor
    teacher_topk_ids: Tensor
    teacher_topk_logprobs: Tensor
    mask: Tensor
    temperature: float = 1.0
    reduce: SumOverRanks | None = None
    step_tokens: Tensor | None = None
    """The step's counted tokens when these rows are one micro-batch of it (`token_kl_loss`)."""

    def __post_init__(self) -> None:
        if self.student_logits.dim() != 3:
            raise ValueError(f"student_logits must be [B, T, V], got {tuple(self.student_logits.shape)}")
        b, t, _ = self.student_logits.shape
        ids, lps = self.teacher_topk_ids, self.teacher_topk_logprobs
        if ids.dim() != 3 or tuple(ids.shape[:2]) != (b, t):
            raise ValueError(f"teacher_topk_ids must be [{b}, {t}, k], got {tuple(ids.shape)}")
        if lps.shape != ids.shape:
            raise ValueError(
                f"teacher_topk_logprobs {tuple(lps.shape)} != teacher_topk_ids {tuple(ids.shape)}"
            )
        if ids.is_floating_point():
            raise ValueError("teacher_topk_ids must be an integer tensor")
        token_mask(self.mask, (b, t))
        _check_temperature(self.temperature)


def topk_distill_loss(inp: TopkDistillInput) -> DistillLossOutput:
    """`T^2 * sum_k p_hat_k (log p_hat_k - log q_k)` per token, mean over counted tokens.

    `p_hat = softmax(teacher_topk_logprobs / T)` over the k ids (the teacher's tempered
    distribution renormalised over its top-k); `log q = log_softmax(student_logits / T)` over
    the full vocabulary, gathered at the k ids (not renormalised; see the module docstring).
    Metrics: `kl` (mean per-token value before `T^2`), `n_tokens`.
    """
    m = token_mask(inp.mask, inp.student_logits.shape[:2])
    m3 = m.unsqueeze(-1)
    t = inp.temperature
    vocab = inp.student_logits.shape[-1]
    ids = keep(inp.teacher_topk_ids, m3)  # garbage ids at padding would break `gather`
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"teacher_topk_ids out of range for vocabulary size {vocab}")
    kl = topk_token_kl(keep(inp.student_logits, m3), ids, keep(inp.teacher_topk_logprobs, m3), t)  # [B, T]
    return token_kl_loss(kl, m, t, inp.reduce, inp.step_tokens)


# --------------------------------------------------------------------------- sampled (MOPD)


@dataclass(frozen=True)
class SampledDistillInput:
    """student_logprobs: [B, T] log-probs of the sampled tokens under the student (with grad);
    teacher_logprobs: [B, T] the teacher's log-probs of the same tokens; rollout_logprobs:
    [B, T] behaviour-policy log-probs from the engine, None = on-policy; mask: [B, T]."""

    student_logprobs: Tensor
    teacher_logprobs: Tensor
    mask: Tensor
    rollout_logprobs: Tensor | None = None
    min_weight: float = 0.5
    max_weight: float = 2.0
    reduce: SumOverRanks | None = None
    step_tokens: Tensor | None = None
    """The step's counted tokens (the metrics' denominator) when these rows are one
    micro-batch of it: every metric is then this micro-batch's part."""
    step_kept: Tensor | None = None
    """The loss's denominator in place of the kept tokens' count (a micro-batch's: the step's
    kept count, known only after every micro-batch's forward, divides the gradient later)."""

    def __post_init__(self) -> None:
        if self.student_logprobs.dim() != 2:
            raise ValueError(f"student_logprobs must be [B, T], got {tuple(self.student_logprobs.shape)}")
        shape = tuple(self.student_logprobs.shape)
        token_mask(self.mask, shape)
        for name in ("teacher_logprobs", "rollout_logprobs"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {shape}")
        if not 0 <= self.min_weight <= 1 <= self.max_weight:
            raise ValueError("need 0 <= min_weight <= 1 <= max_weight")


def sampled_distill_loss(inp: SampledDistillInput) -> DistillLossOutput:
    """`-mean_kept(w_t * a_t * log p_student(o_t))`, `a_t = sg(lp_teacher - lp_student)`.

    Kept tokens: counted by `mask` and with `min_weight <= w_t <= max_weight`.
    Metrics: `reverse_kl` (mean `lp_student - lp_teacher` over all counted tokens, kept or not),
    `overlap` (the teacher's probability of the student's token, averaged over counted tokens: how
    much of the teacher's mass lies on what the student samples; near 0, the student is off the
    teacher's support and the per-token advantages are large and noisy), `kept_fraction` (kept /
    counted), `n_tokens` (counted).
    """
    m = token_mask(inp.mask, inp.student_logprobs.shape)
    student = keep(inp.student_logprobs, m)
    teacher = keep(inp.teacher_logprobs.detach().to(student.dtype), m)
    if inp.rollout_logprobs is None:
        weight = torch.ones_like(student)
    else:
        rollout = keep(inp.rollout_logprobs.detach().to(student.dtype), m)
        weight = torch.exp(student.detach() - rollout)
    kept = m & (weight >= inp.min_weight) & (weight <= inp.max_weight)
    advantage = (teacher - student).detach()
    teacher_prob = keep(teacher.exp(), m)
    loss = masked_token_mean(-(weight * advantage) * student, kept, inp.reduce, inp.step_kept)

    total = inp.reduce or (lambda x: x)
    n_tokens = int(total(m.sum()).item())
    if inp.step_tokens is not None:
        n = float(inp.step_tokens.clamp(min=1))
        return DistillLossOutput(
            loss=loss,
            metrics={
                "reverse_kl": float(keep(-advantage, m).sum()) / n,
                "overlap": float(teacher_prob.sum()) / n,
                "kept_fraction": float(kept.sum()) / n,
                "n_tokens": float(n_tokens),
            },
        )
    reverse_kl = float(total(keep(-advantage, m).sum()).item()) / max(n_tokens, 1)
    return DistillLossOutput(
        loss=loss,
        metrics={
            "reverse_kl": reverse_kl,
            "overlap": float(total(teacher_prob.sum()).item()) / max(n_tokens, 1),
            "kept_fraction": float(total(kept.sum()).item()) / max(n_tokens, 1),
            "n_tokens": float(n_tokens),
        },
    )

"""The GRPO policy loss as Nemotron-Cascade uses it: per-token PPO clip, group-level token mean.

Why each choice (docs/algorithm.md, "The GRPO loss"):
- The importance ratio is per token, `pi_theta / pi_old`, computed in log space from the
  log-probs the rollout engine returned. Without engine log-probs (`old_logprobs=None`) the
  batch is strictly on-policy: the ratio is `exp(logp - logp.detach())`, worth exactly 1 but
  with the REINFORCE gradient `A * grad logp`. (Detaching the *old* log-probs from the current
  ones would make the ratio 1 with clipping dead even for stale data: never do that.)
- `token` aggregation divides each group's summed token loss by that group's total number of
  completion tokens (`1 / sum_i |o_i|`), then averages the groups that have any token.
  `sequence` aggregation averages each sequence's tokens, then the sequences.
- Masked positions (prompt, padding, dropped samples) are replaced before any arithmetic, so
  whatever they hold changes neither the loss nor the gradients.
- Behaviour-policy correction (`behaviour`, off by default; `cascade.algo.behaviour`): the ratio
  is taken against the learner's own detached log-probs (the proximal policy: with one optimizer
  step per batch, the current weights), so it is 1 and the clip the learner's own, and each
  token's policy-gradient term is multiplied by the detached behaviour weight
  `w = f(pi_learner / pi_engine)`. A dropped token (`w = 0`) leaves the loss (its k3 term too),
  but not the normalisers: a group's token mean still divides by all of its counted tokens, so
  dropping a token is weighting it 0 (the loss's scale does not jump with the share dropped, and
  a micro-batch's part needs no count known only after every forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from cascade.algo.behaviour import BehaviourSettings, BehaviourWeights, behaviour_weights
from cascade.algo.masking import MaxOverRanks, SumOverRanks, keep, token_mask

Aggregation = Literal["token", "sequence"]

MAX_METRICS: frozenset[str] = frozenset({"mismatch_max"})
"""The metrics that are maxima, not parts of a sum: over micro-batches and ranks, take the max."""


@dataclass(frozen=True)
class GrpoNorms:
    """The GRPO loss's normalisers over a whole step, computed from every row's counted tokens
    before the step is cut into micro-batches, so that each micro-batch's loss is its part of
    the step's (the parts add up to the one-pass loss, whatever the cut).

    unit_tokens: [B] counted tokens of each row's unit: its group's total (`token`
                 aggregation: the group spans micro-batches wherever its rows land), or its own
                 (`sequence`).
    n_units:     scalar, the units with any counted token, over the step (every rank's).
    n_tokens:    scalar, the counted tokens over the step (every rank's).
    """

    unit_tokens: Tensor
    n_units: Tensor
    n_tokens: Tensor

    def rows(self, lo: int, hi: int) -> GrpoNorms:
        return GrpoNorms(self.unit_tokens[lo:hi], self.n_units, self.n_tokens)

    def to(self, device: torch.device | str) -> GrpoNorms:
        return GrpoNorms(self.unit_tokens.to(device), self.n_units.to(device), self.n_tokens.to(device))


def grpo_normalisers(
    row_tokens: Tensor, group_ids: Tensor, aggregation: Aggregation, reduce: SumOverRanks | None = None
) -> GrpoNorms:
    """`GrpoNorms` from each row's counted tokens [B] and group ids [B] (this rank's whole
    share of groups; `reduce` makes the counts global, in one call)."""
    tokens = row_tokens.to(torch.float32)
    if aggregation == "sequence":
        unit_tokens = tokens
        n_units = (tokens > 0).sum().to(torch.float32)
    else:
        _, inverse = torch.unique(group_ids, return_inverse=True)
        n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
        per_group = tokens.new_zeros(n_groups).index_add(0, inverse, tokens)
        unit_tokens = per_group[inverse] if inverse.numel() else tokens
        n_units = (per_group > 0).sum().to(torch.float32)
    counts = torch.stack([n_units, tokens.sum()])
    if reduce is not None:
        counts = reduce(counts)
    return GrpoNorms(unit_tokens=unit_tokens, n_units=counts[0], n_tokens=counts[1])


@dataclass(frozen=True)
class GrpoLossInput:
    """One learner batch of completions.

    logprobs:      [B, T] current-policy log-probs of the completion tokens (requires grad).
    advantages:    [B]    one advantage per sequence (see `group_advantages`).
    mask:          [B, T] 1/True for tokens that count; prompt, padding, dropped samples 0.
    group_ids:     [B]    long, which prompt group each row belongs to (any integer labels).
    old_logprobs:  [B, T] behaviour-policy log-probs from the rollout engine, the ratio's old
                   policy; None = on-policy. None whenever `behaviour` is on (the ratio's old
                   policy is then the learner's own, `behaviour_logprobs` the engine's).
    ref_logprobs:  [B, T] frozen reference log-probs for the k3 penalty; None = no reference.
    behaviour_logprobs: [B, T] the rollout engine's log-probs of the tokens, for the behaviour
                   correction (needed when `behaviour` is on) and the mismatch metrics (reported
                   whenever given, correction on or off; with it off they change nothing else).
    behaviour:     the correction's mode and bounds (`cascade.algo.behaviour`); off by default.
    reduce_max:    with `reduce`, the maximum over ranks (the `mismatch_max` metric).
    norms:         the step's normalisers for these rows (`grpo_normalisers`): the loss and
                   every metric are then this micro-batch's part of the step's (they add up
                   over the micro-batches, and over ranks); None = the rows are the whole step
                   (or, with `reduce`, one rank's share of it).
    """

    logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    group_ids: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    aggregation: Aggregation = "token"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    kl_coef: float = 0.0
    reduce: SumOverRanks | None = None
    norms: GrpoNorms | None = None
    behaviour_logprobs: Tensor | None = None
    behaviour: BehaviourSettings = BehaviourSettings()
    reduce_max: MaxOverRanks | None = None

    def __post_init__(self) -> None:
        if self.logprobs.dim() != 2:
            raise ValueError(f"logprobs must be [B, T], got shape {tuple(self.logprobs.shape)}")
        b, t = self.logprobs.shape
        if self.norms is not None:
            if self.reduce is not None or self.reduce_max is not None:
                raise ValueError("norms are already global: give norms or reduce, not both")
            if tuple(self.norms.unit_tokens.shape) != (b,):
                raise ValueError(
                    f"norms.unit_tokens has shape {tuple(self.norms.unit_tokens.shape)}, expected {(b,)}"
                )
        token_mask(self.mask, (b, t))
        for name in ("old_logprobs", "ref_logprobs", "behaviour_logprobs"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (b, t):
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {(b, t)}")
        for name in ("advantages", "group_ids"):
            value = getattr(self, name)
            if tuple(value.shape) != (b,):
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {(b,)}")
        if self.aggregation not in ("token", "sequence"):
            raise ValueError(f"aggregation must be 'token' or 'sequence', got {self.aggregation!r}")
        if not 0 <= self.clip_eps_low < 1 or self.clip_eps_high < 0:
            raise ValueError("need 0 <= clip_eps_low < 1 and clip_eps_high >= 0")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_coef > 0 and self.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        if self.behaviour.on and self.behaviour_logprobs is None:
            raise ValueError(f"behaviour correction {self.behaviour.mode!r} needs behaviour_logprobs")
        if self.behaviour.on and self.old_logprobs is not None:
            raise ValueError(
                "with behaviour correction on the ratio's old policy is the learner's own: "
                "give the engine's log-probs as behaviour_logprobs, not old_logprobs"
            )
        if self.reduce is not None and self.behaviour_logprobs is not None and self.reduce_max is None:
            raise ValueError("the mismatch metrics over ranks need reduce_max beside reduce")


@dataclass(frozen=True)
class GrpoLossOutput:
    """loss: scalar tensor to backpropagate. metrics: plain floats for logging.

    Metric keys: `pg_loss` (the clipped policy term alone), `clip_fraction` (share of counted
    tokens whose clipped branch is active, i.e. zero gradient), `ratio_mean`, `n_tokens`, and
    `kl` (mean k3 per counted token) when a reference is given. With behaviour log-probs:
    `mismatch_mean` (mean `|logp - behaviour_logp|` per counted token), `mismatch_max` (its
    largest; a maximum over micro-batches and ranks, `MAX_METRICS`), `mismatch_out_frac` (share
    of counted tokens whose ratio is outside `[low, high]`), `behaviour_dropped_frac` (share of
    counted tokens dropped), and with the correction on `behaviour_weight_mean` (mean weight per
    counted token, dropped ones 0).
    """

    loss: Tensor
    metrics: dict[str, float]


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || ref): `exp(ref - logp) - (ref - logp) - 1` (>= 0).

    logprobs, ref_logprobs: [B, T] -> [B, T]. The reference is detached.
    """
    log_r = ref_logprobs.detach() - logprobs
    return torch.exp(log_r) - log_r - 1.0


def _aggregate(
    per_token: Tensor,
    m: Tensor,
    group_ids: Tensor,
    aggregation: Aggregation,
    reduce: SumOverRanks | None = None,
) -> Tensor:
    """Reduce a masked per-token loss [B, T] (zeros where `m` is False) to a scalar.

    With `reduce`, the rows are one rank's share of whole groups: the result is this share's
    part of the global value (its per-unit sum over the global number of units), so the ranks'
    results add up to what one process would compute on the whole batch."""
    seq_sum = per_token.sum(dim=1)  # [B]
    seq_len = m.sum(dim=1).to(per_token.dtype)  # [B]
    if aggregation == "sequence":
        unit_sum, unit_len = seq_sum, seq_len
    else:
        _, inverse = torch.unique(group_ids, return_inverse=True)
        n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
        unit_sum = per_token.new_zeros(n_groups).index_add(0, inverse, seq_sum)  # [n_groups]
        unit_len = per_token.new_zeros(n_groups).index_add(0, inverse, seq_len)  # [n_groups]
    has = unit_len > 0
    if reduce is not None:
        n_units = reduce(has.sum().to(per_token.dtype))
        return (unit_sum[has] / unit_len[has]).sum() / n_units.clamp(min=1)
    if not bool(has.any()):
        return per_token.sum() * 0.0
    return (unit_sum[has] / unit_len[has]).mean()


def grpo_loss(inp: GrpoLossInput) -> GrpoLossOutput:
    """Clipped GRPO loss (+ optional k3 penalty), aggregated as `inp.aggregation` says.

    Per counted token: `-min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    + kl_coef * k3`, with `ratio = exp(logp - old_logp)`. With the behaviour correction on, the
    first term is multiplied by the token's detached weight `w` and `old_logp` is `logp`
    detached; a dropped token counts nothing.
    """
    m = token_mask(inp.mask, inp.logprobs.shape)
    logp = keep(inp.logprobs, m)
    bw = None
    if inp.behaviour_logprobs is not None:
        bw = behaviour_weights(inp.logprobs, inp.behaviour_logprobs, m, inp.behaviour)
    if inp.old_logprobs is None:
        old = logp.detach()
    else:
        old = keep(inp.old_logprobs.detach().to(logp.dtype), m)
    adv = keep(inp.advantages.detach().to(logp.dtype).unsqueeze(1).expand_as(logp), m)

    ratio = torch.exp(logp - old)  # 1 at masked positions
    clipped_ratio = ratio.clamp(1.0 - inp.clip_eps_low, 1.0 + inp.clip_eps_high)
    clip_active = m & (
        ((adv > 0) & (ratio > 1.0 + inp.clip_eps_high)) | ((adv < 0) & (ratio < 1.0 - inp.clip_eps_low))
    )
    # `where` (not `minimum`) so the gradient goes wholly to the branch that is chosen.
    surrogate = torch.where(clip_active, clipped_ratio * adv, ratio * adv)
    corrected = bw is not None and inp.behaviour.on
    in_loss = m  # the counted tokens that the loss keeps (with the correction on, not the dropped)
    if bw is not None and corrected:
        surrogate = surrogate * bw.weight.to(surrogate.dtype)
        in_loss = bw.kept
    pg_token = keep(-surrogate, in_loss)
    per_token = pg_token

    total = inp.reduce or (lambda t: t)
    n_tokens = int(total(m.sum()).item())
    denom = max(n_tokens, 1)
    metrics: dict[str, float] = {
        "clip_fraction": float(total(clip_active.sum()).item()) / denom,
        "ratio_mean": float(total(keep(ratio.detach(), m).sum()).item()) / denom,
        "n_tokens": float(n_tokens),
    }
    kl_token = None
    if inp.ref_logprobs is not None:
        ref = keep(inp.ref_logprobs.detach().to(logp.dtype), m)
        kl_token = keep(k3_kl(logp, ref), m)
        metrics["kl"] = float(total(kl_token.detach().sum()).item()) / denom
        if inp.kl_coef > 0:
            per_token = per_token + inp.kl_coef * (keep(kl_token, in_loss) if corrected else kl_token)

    if inp.norms is not None:
        return _part_of_step(
            per_token, pg_token, m, clip_active, ratio, kl_token, inp.norms, bw, inp.behaviour
        )
    loss = _aggregate(per_token, m, inp.group_ids, inp.aggregation, inp.reduce)
    pg = _aggregate(pg_token.detach(), m, inp.group_ids, inp.aggregation, inp.reduce)
    metrics["pg_loss"] = float(total(pg).item())
    if bw is not None:
        metrics.update(_behaviour_metrics(bw, inp.behaviour, float(denom), total, inp.reduce_max))
    return GrpoLossOutput(loss=loss, metrics=metrics)


def _behaviour_metrics(
    bw: BehaviourWeights,
    settings: BehaviourSettings,
    n: float,
    total: SumOverRanks,
    maximum: MaxOverRanks | None,
) -> dict[str, float]:
    """The mismatch metrics over `n` counted tokens: the sums through `total` (in one call), the
    maximum through `maximum` (none: these rows are all there is, or a part whose maximum is
    taken over the parts by the caller)."""
    parts = [bw.abs_diff_sum, bw.out_of_range, bw.dropped]
    if settings.on:
        parts.append(bw.weight.sum())
    sums = total(torch.stack(parts)).tolist()
    top = bw.abs_diff_max if maximum is None else maximum(bw.abs_diff_max)
    out = {
        "mismatch_mean": sums[0] / n,
        "mismatch_max": float(top),
        "mismatch_out_frac": sums[1] / n,
        "behaviour_dropped_frac": sums[2] / n,
    }
    if settings.on:
        out["behaviour_weight_mean"] = sums[3] / n
    return out


def _part_of_step(
    per_token: Tensor,
    pg_token: Tensor,
    m: Tensor,
    clip_active: Tensor,
    ratio: Tensor,
    kl_token: Tensor | None,
    norms: GrpoNorms,
    bw: BehaviourWeights | None,
    settings: BehaviourSettings,
) -> GrpoLossOutput:
    """These rows' part of the step's loss and metrics: each row's token sum over its unit's
    step-wide token count, over the step's unit count (`_aggregate`'s arithmetic, with the
    denominators taken from the whole step). Every metric is a part too, `n_tokens` these rows'
    count: all of them add up over micro-batches and ranks, but `MAX_METRICS`, these rows' maximum
    (the step's is the maximum of the parts)."""
    has = norms.unit_tokens > 0
    scale = torch.where(has, 1.0 / norms.unit_tokens.clamp(min=1), torch.zeros_like(norms.unit_tokens))
    scale = (scale / norms.n_units.clamp(min=1)).to(per_token.dtype)  # [B]
    loss = (per_token.sum(dim=1) * scale).sum()
    n = float(norms.n_tokens.clamp(min=1))
    metrics = {
        "clip_fraction": float(clip_active.sum()) / n,
        "ratio_mean": float(keep(ratio.detach(), m).sum()) / n,
        "n_tokens": float(m.sum()),
        "pg_loss": float((pg_token.detach().sum(dim=1) * scale).sum()),
    }
    if kl_token is not None:
        metrics["kl"] = float(kl_token.detach().sum()) / n
    if bw is not None:
        metrics.update(_behaviour_metrics(bw, settings, n, lambda t: t, None))
    return GrpoLossOutput(loss=loss, metrics=metrics)

"""Behaviour-policy correction: the rollout engine's log-probs are not the learner's.

The engine samples in its own kernels and precision (vLLM in bfloat16 on a GPU), so even
on-policy its log-probs of the sampled tokens differ from the learner's. The GRPO term can
weight each token by how much more (or less) likely the learner finds it than the engine did,
`ratio = pi_learner / pi_behaviour = exp(logp - behaviour_logp)` (docs/algorithm.md,
"Behaviour-policy correction"):

- `tis` (truncated importance sampling, Yao et al.): `w = min(ratio, high)` on every counted
  token;
- `masked` (IcePop): `w = ratio` where `low <= ratio <= high`; a token outside is dropped
  (`w = 0`);
- `seq_mask` (NeMo-RL's seq-mask-TIS): a sequence whose summed log-ratio over its counted tokens
  is larger than `seq_threshold` in size is dropped whole; the other sequences' tokens get
  `w = min(ratio, high)`;
- `off`: `w = 1`, nothing dropped (the mismatch is still measured).

The weights are computed from detached log-probs: they scale the gradient, never receive one.
The mismatch numbers come out as sums (and one maximum) so that micro-batches and ranks add up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from cascade.algo.masking import keep, token_mask

CorrectionMode = Literal["off", "tis", "masked", "seq_mask"]
CORRECTION_MODES: tuple[str, ...] = ("off", "tis", "masked", "seq_mask")


@dataclass(frozen=True)
class BehaviourSettings:
    """The correction's settings (`grpo.behaviour_correction` of a stage).

    mode:          which correction (`off`, `tis`, `masked`, `seq_mask`; module docstring).
    low, high:     the ratio bounds: `masked` drops tokens outside `[low, high]`, `tis` and
                   `seq_mask` truncate at `high`; every mode counts the tokens outside.
    seq_threshold: `seq_mask` drops a sequence with `|sum_t (logp - behaviour_logp)| >` this.
    """

    mode: CorrectionMode = "off"
    low: float = 0.5
    high: float = 2.0
    seq_threshold: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in CORRECTION_MODES:
            raise ValueError(f"mode must be one of {CORRECTION_MODES}, got {self.mode!r}")
        if not 0 < self.low <= 1 <= self.high:
            raise ValueError(f"need 0 < low <= 1 <= high, got low={self.low}, high={self.high}")
        if not self.seq_threshold > 0:
            raise ValueError(f"seq_threshold must be > 0, got {self.seq_threshold}")

    @property
    def on(self) -> bool:
        return self.mode != "off"


@dataclass(frozen=True)
class BehaviourWeights:
    """The per-token correction of one batch and its mismatch numbers.

    weight:       [B, T] float32, detached: the factor on each token's policy-gradient term (1 with
                  `off`, 0 at masked-out and dropped positions).
    kept:         [B, T] bool: the counted tokens that stay in the loss.
    abs_diff_sum: scalar, sum over the counted tokens of `|logp - behaviour_logp|`.
    out_of_range: scalar, counted tokens whose ratio is outside `[low, high]`.
    dropped:      scalar, counted tokens dropped (`masked`, `seq_mask`; 0 otherwise).
    abs_diff_max: scalar, the largest `|logp - behaviour_logp|` of a counted token (0 if none).
    """

    weight: Tensor
    kept: Tensor
    abs_diff_sum: Tensor
    out_of_range: Tensor
    dropped: Tensor
    abs_diff_max: Tensor


def behaviour_weights(
    logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, settings: BehaviourSettings
) -> BehaviourWeights:
    """The correction of `settings.mode` for learner log-probs `logprobs` [B, T] (detached here)
    against the engine's `behaviour_logprobs` [B, T], counted tokens `mask` [B, T]. Whatever the
    masked-out positions hold (inf, nan) changes nothing."""
    m = token_mask(mask, logprobs.shape)
    shape, expected = tuple(behaviour_logprobs.shape), tuple(logprobs.shape)
    if shape != expected:
        raise ValueError(f"behaviour_logprobs has shape {shape}, expected {expected}")
    logp = keep(logprobs.detach().to(torch.float32), m)
    behav = keep(behaviour_logprobs.detach().to(torch.float32), m)
    diff = keep(logp - behav, m)  # 0 at masked-out positions: ratio 1
    ratio = torch.exp(diff)
    out_of_range = m & ((ratio < settings.low) | (ratio > settings.high))
    if settings.mode == "off":
        kept = m
        weight = torch.ones_like(ratio)
    elif settings.mode == "tis":
        kept = m
        weight = ratio.clamp(max=settings.high)
    elif settings.mode == "masked":
        kept = m & ~out_of_range
        weight = ratio
    else:  # seq_mask
        seq_err = diff.sum(dim=1).abs()  # [B]
        kept = m & (seq_err <= settings.seq_threshold).unsqueeze(1)
        weight = ratio.clamp(max=settings.high)
    abs_diff = diff.abs()
    return BehaviourWeights(
        weight=keep(weight, kept),
        kept=kept,
        abs_diff_sum=abs_diff.sum(),
        out_of_range=out_of_range.sum().to(torch.float32),
        dropped=(m & ~kept).sum().to(torch.float32),
        abs_diff_max=abs_diff.max() if abs_diff.numel() else abs_diff.new_zeros(()),
    )

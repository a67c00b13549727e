"""Group-relative advantages (GRPO): each completion is judged against its own group only.

Normalising per group, not per batch, is the point: a hard prompt whose best completion scores
0.3 still gets a positive advantage for it. The spread is the *sample* standard deviation
(Bessel-corrected, `correction=1`), which reproduces the worked example of the Nemotron-Cascade
notes (seed 002): rewards `[1, 1, 0, 0]` give advantages `+-0.866` (population std would give
`+-1.0`). A group whose rewards are all equal carries no signal; its advantages are exactly 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_rewards(rewards: Tensor) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [n_groups, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ValueError(f"a group needs at least 2 completions, got G={rewards.shape[1]}")
    return rewards if rewards.is_floating_point() else rewards.to(torch.float32)


def zero_variance_mask(rewards: Tensor) -> Tensor:
    """True for groups whose rewards are all exactly equal.

    rewards: [n_groups, G]. Returns a bool tensor [n_groups].
    """
    rewards = _check_rewards(rewards)
    return (rewards == rewards[:, :1]).all(dim=1)


def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """`(r - mean) / (std + eps)` within each group, with the sample (unbiased) std.

    rewards: [n_groups, G] -> advantages [n_groups, G] (same float dtype; integer rewards
    become float32). Groups with all-equal rewards get exactly 0, not a rounding residue.
    """
    rewards = _check_rewards(rewards)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, correction=1)
    adv = (rewards - mean) / (std + eps)
    flat = zero_variance_mask(rewards).unsqueeze(1)
    return torch.where(flat, torch.zeros_like(adv), adv)

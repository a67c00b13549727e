"""Group-relative advantages (GRPO): each completion is judged against its own group only.

Normalising per group, not per batch, is the point: a hard prompt whose best completion scores
0.3 still gets a positive advantage for it. The spread is the *sample* standard deviation
(Bessel-corrected, `correction=1`), as in the worked example of docs/algorithm.md: rewards
`[1, 1, 0, 0]` give advantages `+-0.866` (population std would give `+-1.0`). A group whose
rewards are all equal carries no signal; its advantages are exactly 0.

A sample whose verifier failed (`infra_error`) has no reward, only a placeholder: with a
validity mask it takes no part in its group's mean and std and gets advantage 0. Counted at
its group's mean, it would add nothing to the spread but 1 to the n-1 of the std, inflating
the others by `sqrt((G-1)/(n_valid-1))`: `[1, 0, err, err]` must give `+-0.7071`, not
`+-1.2247`. A group
with fewer than 2 valid samples has no spread to normalise by and gets 0 throughout.
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


def _check_valid(rewards: Tensor, valid: Tensor | None) -> Tensor:
    if valid is None:
        return torch.ones_like(rewards, dtype=torch.bool)
    if valid.shape != rewards.shape:
        raise ValueError(f"valid must match rewards {tuple(rewards.shape)}, got {tuple(valid.shape)}")
    return valid.to(device=rewards.device, dtype=torch.bool)


def zero_variance_mask(rewards: Tensor, valid: Tensor | None = None) -> Tensor:
    """True for groups without signal: their valid rewards are all exactly equal, or fewer
    than 2 of their samples are valid.

    rewards: [n_groups, G]; valid: bool [n_groups, G] or None (all valid). Returns bool [n_groups].
    """
    rewards = _check_rewards(rewards)
    valid = _check_valid(rewards, valid)
    # Compare each valid reward with the group's first valid one; invalid ones always agree.
    first = torch.gather(rewards, 1, valid.to(torch.uint8).argmax(dim=1, keepdim=True))
    same = (rewards == first) | ~valid
    return same.all(dim=1) | (valid.sum(dim=1) < 2)


def group_advantages(rewards: Tensor, valid: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """`(r - mean) / (std + eps)` within each group over its valid samples, sample std.

    rewards: [n_groups, G]; valid: bool [n_groups, G] (False: the verifier failed) or None
    (all valid) -> advantages [n_groups, G] (same float dtype; integer rewards become
    float32). Invalid samples get exactly 0 and their reward values are never read (they may
    be NaN). Groups with all-equal valid rewards, or fewer than 2 valid samples, get exactly 0.
    """
    rewards = _check_rewards(rewards)
    valid = _check_valid(rewards, valid)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    n = valid.sum(dim=1, keepdim=True).to(r.dtype)
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    dev = torch.where(valid, r - mean, torch.zeros_like(r))
    std = ((dev**2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    adv = dev / (std + eps)
    flat = zero_variance_mask(rewards, valid).unsqueeze(1)
    return torch.where(flat | ~valid, torch.zeros_like(adv), adv)

"""A step over several domains (a multi-domain RL stage, an mopd stage): how many of the step's
prompts each domain gets, and what each domain's groups did.

Each domain's prompts are its own groups (one prompt, one group), scored by that domain's
verifier and normalised on their own: mixing domains never mixes a group."""

from __future__ import annotations

import math

from cascade.rollout.requests import RolloutBatch


def prompt_counts(total: int, shares: dict[str, float]) -> dict[str, int]:
    """`total` prompts split by `shares` (summing to 1): each domain's floor, then the rest one
    by one to the largest remainders (ties to the earlier domain). A domain may get 0."""
    exact = {d: total * s for d, s in shares.items()}
    counts = {d: math.floor(v) for d, v in exact.items()}
    left = total - sum(counts.values())
    order = sorted(shares, key=lambda d: (-(exact[d] - counts[d]), list(shares).index(d)))
    for d in order[:left]:
        counts[d] += 1
    return counts


def per_domain_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Each domain's share of the step's groups, mean reward (over samples whose verifier ran)
    and share of groups whose rewards are all equal (no signal): `<metric>/<domain>` keys."""
    g = batch.group_size
    rewards = batch.rewards()  # [N, G]
    valid = batch.valid_mask().view(batch.n_groups, g)
    out: dict[str, float] = {}
    for domain in dict.fromkeys(p.domain for p in batch.problems):
        rows = [i for i, p in enumerate(batch.problems) if p.domain == domain]
        r, v = rewards[rows], valid[rows]
        counted = r[v]
        flat = [(float(x.min()), float(x.max())) for x, keep in zip(r, v, strict=True) if bool(keep.any())]
        out[f"groups/{domain}"] = float(len(rows))
        out[f"reward_mean/{domain}"] = float(counted.mean()) if counted.numel() else 0.0
        out[f"zero_variance_groups/{domain}"] = sum(lo == hi for lo, hi in flat) / len(flat) if flat else 0.0
    return out

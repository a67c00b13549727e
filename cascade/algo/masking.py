"""Masking helpers shared by the losses: padding and prompt tokens must never enter a loss.

Multiplying by a 0/1 mask is not enough: `0 * inf` and `0 * nan` are `nan`, and padded
positions of a batch may hold anything (garbage logits, `-inf` log-probs). Every loss therefore
first replaces masked-out positions with a harmless constant via `torch.where`, whose backward
sends exactly zero gradient to the replaced positions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

SumOverRanks = Callable[[Tensor], Tensor]
"""Sums a tensor over the data-parallel ranks (an all-reduce). Given to a loss whose batch is
one rank's share, it makes every count and mean global, so that N ranks compute the update one
process would on the whole batch. None: this process holds the whole batch."""

MaxOverRanks = Callable[[Tensor], Tensor]
"""The elementwise maximum of a tensor over the data-parallel ranks (an all-reduce), for the few
metrics that are maxima (`SumOverRanks`'s companion). None: this process holds the whole batch."""


def token_mask(mask: Tensor, shape: torch.Size | tuple[int, ...], name: str = "mask") -> Tensor:
    """Bool version of `mask` ([B, T], 0/1 or bool; non-zero counts), checked against `shape`."""
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(shape)}")
    return mask != 0


def keep(values: Tensor, mask: Tensor, fill: float = 0.0) -> Tensor:
    """`values` where `mask` is true, else `fill`; `mask` broadcasts against `values`.

    The gradient reaching a filled position is exactly zero, and no `nan`/`inf` from the
    filled positions can leak into the forward value.
    """
    return torch.where(mask, values, torch.full_like(values, fill))


def masked_token_mean(
    values: Tensor, mask: Tensor, reduce: SumOverRanks | None = None, count: Tensor | None = None
) -> Tensor:
    """Mean of `values` [B, T] over the true positions of bool `mask` [B, T].

    With no true position the result is a graph-connected 0 (so `backward()` still works).
    With `reduce`, the count is global: the result is this rank's part of the global mean.
    With `count` (the whole step's, counted before it was cut into micro-batches), the result
    is these rows' part of the step's mean.
    """
    kept = keep(values, mask)
    n = mask.sum() if count is None else count
    if reduce is not None and count is None:
        n = reduce(n)
    return kept.sum() / n.clamp(min=1).to(kept.dtype)

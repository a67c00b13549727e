"""A term's metrics over a micro-batched step: each micro-batch reports its part of the step's
value (losses and metrics are normalised by the step's counts before the cut), so the step's
value is their sum, over micro-batches and then over ranks in one all-reduce. The few metrics
that are maxima (`maxima`, e.g. the largest engine/learner log-prob gap) take the maximum
instead, over micro-batches and then over ranks in one more all-reduce."""

from __future__ import annotations

from collections.abc import Collection

import torch

from cascade.algo.masking import MaxOverRanks, SumOverRanks


class TermSums:
    def __init__(self, maxima: Collection[str] = ()) -> None:
        self.values: dict[str, float] = {}
        self.maxima = frozenset(maxima)

    def add(self, parts: dict[str, float]) -> None:
        for key, value in parts.items():
            if key in self.maxima:
                self.values[key] = max(self.values[key], value) if key in self.values else value
            else:
                self.values[key] = self.values.get(key, 0.0) + value

    def over_ranks(
        self,
        reduce: SumOverRanks | None,
        *,
        local: tuple[str, ...] = (),
        reduce_max: MaxOverRanks | None = None,
    ) -> dict[str, float]:
        """Every sum over all ranks (one call of `reduce`) and every maximum (one call of
        `reduce_max`, needed with `reduce` when a maximum was added), except the `local` keys
        (the same on every rank, such as the micro-batch count)."""
        keys = sorted(k for k in self.values if k not in local and k not in self.maxima)
        top = sorted(k for k in self.values if k not in local and k in self.maxima)
        out = {k: self.values[k] for k in local if k in self.values}
        if reduce is None:
            out.update({k: self.values[k] for k in keys + top})
            return out
        if keys:
            summed = reduce(torch.tensor([self.values[k] for k in keys], dtype=torch.float64))
            out.update({k: float(v) for k, v in zip(keys, summed.tolist(), strict=True)})
        if top:
            if reduce_max is None:
                raise ValueError(f"the maxima {top} over ranks need reduce_max beside reduce")
            peak = reduce_max(torch.tensor([self.values[k] for k in top], dtype=torch.float64))
            out.update({k: float(v) for k, v in zip(top, peak.tolist(), strict=True)})
        return out

"""A term's metrics over a micro-batched step: each micro-batch reports its part of the step's
value (losses and metrics are normalised by the step's counts before the cut), so the step's
value is their sum, over micro-batches and then over ranks in one all-reduce."""

from __future__ import annotations

import torch

from cascade.algo.masking import SumOverRanks


class TermSums:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def add(self, parts: dict[str, float]) -> None:
        for key, value in parts.items():
            self.values[key] = self.values.get(key, 0.0) + value

    def over_ranks(self, reduce: SumOverRanks | None, *, local: tuple[str, ...] = ()) -> dict[str, float]:
        """Every sum over all ranks (one call of `reduce`), except the `local` keys (the same on
        every rank, such as the micro-batch count)."""
        keys = sorted(k for k in self.values if k not in local)
        out = {k: self.values[k] for k in local if k in self.values}
        if reduce is None or not keys:
            out.update({k: self.values[k] for k in keys})
            return out
        summed = reduce(torch.tensor([self.values[k] for k in keys], dtype=torch.float64))
        out.update({k: float(v) for k, v in zip(keys, summed.tolist(), strict=True)})
        return out

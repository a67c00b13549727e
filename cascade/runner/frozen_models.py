"""Frozen copies of the policy (teachers, KL references), loaded once and reloaded only when
the checkpoint behind a name changes (a domain's teacher is replaced by a better checkpoint).
They live on the learner's device, in the dtype its precision policy gives frozen models."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from cascade.model.loading import load_model_weights_only


class FrozenModelCache:
    def __init__(self, dtype: str, device: torch.device | str = "cpu") -> None:
        self.dtype = dtype
        self.device = device
        self._models: dict[str, tuple[str, PreTrainedModel]] = {}

    def get(self, name: str, path: str | Path) -> PreTrainedModel:
        cached = self._models.get(name)
        if cached is None or cached[0] != str(path):
            cached = (str(path), load_model_weights_only(path, self.dtype, str(self.device)))
            self._models[name] = cached
        return cached[1]

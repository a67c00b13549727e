"""`cascade up`'s rollout-engine flags: `--engine hf|vllm` and the vLLM engine's settings.

The flags become a `VllmEngineConfig` (an out-of-range value is refused naming its flag), are
checked against the model's config before any process starts (as `cascade-rollout` checks its
own), and are written back as `launch` entries so the resume command restarts the same engine.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the parser is built without importing the config models
    from cascade.config import VllmEngineConfig

FLAG_OF_FIELD = {
    "dtype": "--vllm-dtype",
    "enforce_eager": "--vllm-enforce-eager",
    "kv_cache_gib": "--vllm-kv-cache-gib",
    "gpu_memory_utilization": "--vllm-gpu-memory-utilization",
    "max_model_len": "--vllm-max-model-len",
    "tensor_parallel_size": "--vllm-tensor-parallel-size",
}


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="rollout service engine: hf (in this environment) or vllm (in the vLLM environment, "
        "`make vllm-env`; every other process stays here) (default: %(default)s)",
    )
    p.add_argument(
        "--vllm-python",
        help="Python of the vLLM environment (default: $CASCADE_VLLM_VENV/bin/python, else the "
        "repo's .venv-vllm/bin/python)",
    )
    p.add_argument(
        "--vllm-dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="vllm: weights dtype (default auto: float32 on the CPU build, as the learner computes; "
        "bfloat16 on a GPU)",
    )
    p.add_argument(
        "--vllm-enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vllm: no torch.compile / CUDA graphs (default: on for the CPU build, where compiling "
        "adds ~30 s to the start; off on a GPU)",
    )
    p.add_argument(
        "--vllm-kv-cache-gib",
        type=float,
        help="vllm: KV-cache size in GiB, overrides --vllm-gpu-memory-utilization (default: 1 on the "
        "CPU build, where vLLM would otherwise reserve 85%% of the host's RAM)",
    )
    p.add_argument(
        "--vllm-gpu-memory-utilization",
        type=float,
        default=0.85,
        help="vllm: share of the GPU's memory when no KV-cache size is given (default: %(default)s)",
    )
    p.add_argument(
        "--vllm-max-model-len", type=int, help="vllm: context length to serve (default: the model's)"
    )
    p.add_argument(
        "--vllm-tensor-parallel-size",
        type=int,
        default=1,
        help="vllm: GPUs one rollout replica is split over (default: %(default)s)",
    )


def vllm_settings(args: argparse.Namespace, model: Path) -> VllmEngineConfig:
    """The vLLM settings the flags give, checked against `model`'s config; ValueError naming the flag."""
    from pydantic import ValidationError

    from cascade.config import VllmEngineConfig

    try:
        settings = VllmEngineConfig(
            dtype=args.vllm_dtype,
            enforce_eager=args.vllm_enforce_eager,
            kv_cache_gib=args.vllm_kv_cache_gib,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_len=args.vllm_max_model_len,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
        )
    except ValidationError as err:
        first = err.errors()[0]
        raise ValueError(f"{FLAG_OF_FIELD[str(first['loc'][0])]}: {first['msg']}") from None
    from cascade.engine.vllm import VllmSettingsError, resolve_settings
    from cascade.engine.weights import read_config

    try:  # what the model decides; the CPU build's own refusals come from the service at start
        resolve_settings(settings, read_config(model) or {}, on_cpu=False)
    except VllmSettingsError as err:
        field, _, why = str(err).partition(": ")
        raise ValueError(f"{FLAG_OF_FIELD[field]}: {why}") from None
    return settings


def engine_launch(engine: str, settings: VllmEngineConfig, python: str | None) -> dict[str, Any]:
    """The engine's part of `run.json`'s `launch`, by flag name (`cascade.runner.record.launch_flags`):
    the flags that were set, so the resume command starts the same rollout service."""
    from cascade.config import VllmEngineConfig

    if engine != "vllm":
        return {"engine": engine}
    launch: dict[str, Any] = {"engine": "vllm"}
    if python is not None:
        launch["vllm_python"] = python
    defaults = VllmEngineConfig()
    for name, flag in FLAG_OF_FIELD.items():
        value = getattr(settings, name)
        if value == getattr(defaults, name):
            continue
        key = flag.removeprefix("--").replace("-", "_")
        if name == "enforce_eager":  # a boolean flag: its `--no-` form when off
            launch[key if value else f"no_{key}"] = True
        else:
            launch[key] = value
    return launch

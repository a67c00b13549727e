"""`cascade-rollout` / `python -m services.rollout.main`: the rollout service.

Serves one policy (HF engine on CPU or GPU, or vLLM on a GPU host) behind gRPC: Generate,
UpdateWeights (checkpoint path), UpdateWeightsStream (streamed tensors), GetModelInfo; gRPC
health; `/metrics` and `/health` over HTTP. Arguments are parsed before torch, transformers or
vLLM are imported, so `--help` and bad flags answer at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from services.entry import add_serving_arguments, run_service, serve_grpc, start_metrics_port

log = logging.getLogger("cascade.rollout")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cascade-rollout", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="Hugging Face checkpoint directory to serve")
    p.add_argument(
        "--engine", choices=["hf", "vllm"], default="hf", help="generation engine (default: %(default)s)"
    )
    p.add_argument("--device", default="cpu", help="hf engine: cpu, cuda, cuda:1, ... (default: %(default)s)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="weights dtype (default: float32 for hf; vllm: float32 on its CPU build, bfloat16 on a GPU)",
    )
    p.add_argument(
        "--version", type=int, default=0, help="policy version of the starting weights (default: 0)"
    )
    p.add_argument(
        "--update-mode",
        choices=["swap", "drain"],
        default="swap",
        help="hf engine: swap = new weights in a copy, calls in flight finish on the old one "
        "(2x weight memory during a switch); drain = wait for calls in flight, load in place "
        "(default: %(default)s; vllm always drains)",
    )
    p.add_argument(
        "--turn-kv-mib",
        type=int,
        default=None,
        help="hf engine: MiB of keys/values kept between the rounds of multi-turn rollouts, so a "
        "later round prefills only what is new (cascade/engine/prefix_kv.py); 0 = off (default: "
        "1024, the embedded run's, which a distributed run must match to stay equal to it)",
    )
    p.add_argument(
        "--max-concurrent", type=int, default=4, help="Generate calls run at once (default: %(default)s)"
    )
    p.add_argument("--max-prompts", type=int, default=4096, help="prompts per request (default: %(default)s)")
    p.add_argument(
        "--max-group-size", type=int, default=1024, help="completions per prompt (default: %(default)s)"
    )
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads, 0 = torch's default")
    p.add_argument("--think-flag", default="/think", help="appended to chat prompts with thinking on")
    p.add_argument("--no-think-flag", default="/no_think", help="appended to chat prompts with thinking off")
    p.add_argument("--system-prompt", default=None, help="system message for chat prompts that have none")
    p.add_argument(
        "--gpu-memory-utilization", type=float, default=0.85, help="vllm only (default: %(default)s)"
    )
    p.add_argument("--max-model-len", type=int, default=None, help="vllm only: context length to serve")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm only (default: %(default)s)")
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vllm only: no torch.compile / CUDA graphs (default: on for the CPU build, off on a GPU)",
    )
    p.add_argument(
        "--kv-cache-gib",
        type=float,
        default=None,
        help="vllm only: KV-cache size, overrides --gpu-memory-utilization (default: 1 on the CPU build)",
    )
    add_serving_arguments(p, port=50052, metrics_port=9101, rpc_threads=16)
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"--model: {args.model} is not a model directory (no config.json)")
    for name in ("max_concurrent", "max_prompts", "max_group_size", "rpc_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.torch_threads < 0:
        p.error("--torch-threads must be 0 (default) or positive")
    if args.turn_kv_mib is not None and args.turn_kv_mib < 0:
        p.error("--turn-kv-mib must be 0 (off) or positive")
    if args.engine == "vllm":
        from pydantic import ValidationError

        from cascade.config import VllmEngineConfig

        try:
            args.vllm_settings = VllmEngineConfig(**_vllm_fields(args))
        except ValidationError as err:
            first = err.errors()[0]
            p.error(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}")
        from cascade.engine.vllm import VllmSettingsError, resolve_settings
        from cascade.engine.weights import read_config

        try:  # what the model's config decides (the platform's own checks come at engine start)
            resolve_settings(args.vllm_settings, read_config(args.model) or {}, on_cpu=False)
        except VllmSettingsError as err:
            field, _, why = str(err).partition(": ")
            p.error(f"--{field.replace('_', '-')}: {why}")
    return args


def _vllm_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields = {
        "dtype": args.dtype or "auto",
        "enforce_eager": args.enforce_eager,
        "kv_cache_gib": args.kv_cache_gib,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_model_len": args.max_model_len,
        "tensor_parallel_size": args.tensor_parallel_size,
    }
    return fields


def build_engine(args: argparse.Namespace) -> Any:
    if args.engine == "vllm":
        from cascade.engine.vllm import VLLMEngine

        return VLLMEngine(args.model, settings=args.vllm_settings, version=args.version)
    from cascade.engine.hf_engine import HFEngine
    from cascade.engine.prefix_kv import DEFAULT_MAX_BYTES

    return HFEngine.from_dir(
        args.model,
        dtype=args.dtype or "float32",
        device=args.device,
        version=args.version,
        swap=args.update_mode == "swap",
        turn_kv_bytes=DEFAULT_MAX_BYTES if args.turn_kv_mib is None else args.turn_kv_mib << 20,
    )


def serve(args: argparse.Namespace) -> int:
    import torch

    from cascade.config import ChatConfig
    from cascade_proto.v1 import rollout_pb2_grpc
    from services.rollout.metrics import RolloutMetrics
    from services.rollout.requests import Limits
    from services.rollout.server import SERVICE_NAME, RolloutServicer

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    metrics = RolloutMetrics()
    metrics_port = start_metrics_port(args, metrics.registry)  # /health answers while the model loads
    engine = build_engine(args)
    servicer = RolloutServicer(
        engine,
        engine.tokenizer,
        metrics,
        chat=ChatConfig(
            think_flag=args.think_flag, no_think_flag=args.no_think_flag, system_prompt=args.system_prompt
        ),
        limits=Limits(max_prompts=args.max_prompts, max_group_size=args.max_group_size),
        max_concurrent=args.max_concurrent,
    )
    info = engine.info
    serve_grpc(
        args,
        metrics_port,
        lambda s: rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, s),
        service_name=SERVICE_NAME,
        thread_prefix="rollout-rpc",
        log=log,
        ready=lambda port, http_port: (
            f"rollout service on {args.host}:{port} (metrics on :{http_port}): {info.kind} engine, "
            f"{info.model}, vocab {info.vocab_size}, context {info.max_context}, version {engine.version}"
        ),
    )
    engine.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_service(parse_args, serve, argv)


if __name__ == "__main__":
    sys.exit(main())

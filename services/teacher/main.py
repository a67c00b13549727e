"""`cascade-teacher` / `python -m services.teacher.main`: the teacher service.

Hosts several named teachers (one per finished domain: `--teacher math=/ckpt/math-best`),
loaded from their checkpoint directories on first use within `--memory-budget-mb`, and answers
their log-probs on the student's tokens (sampled / topk / full) over gRPC, batching concurrent
requests. gRPC health; `/metrics` and `/health` over HTTP. Arguments are parsed before torch
and transformers are imported.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from services.entry import add_serving_arguments, run_service, serve_grpc, start_metrics_port

log = logging.getLogger("cascade.teacher")


def _teacher(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, Path(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cascade-teacher", description=__doc__.splitlines()[0])
    p.add_argument(
        "--teacher",
        type=_teacher,
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a teacher and its checkpoint directory (repeat; more can be set by RPC)",
    )
    p.add_argument(
        "--memory-budget-mb",
        type=float,
        default=4096.0,
        help="weights of resident teachers stay under this; least recently used go first "
        "(default: %(default)s)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: %(default)s)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument(
        "--max-batch-sequences",
        type=int,
        default=64,
        help="sequences per forward; concurrent requests are merged up to this (default: %(default)s)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=32768,
        help="padded tokens (prompt + completion) per forward: a request's sequences go through the "
        "model in forwards within this; a longer sequence is refused (default: %(default)s)",
    )
    p.add_argument(
        "--logits-chunk-mib",
        type=float,
        default=256.0,
        help="float32 logits computed at a time: a forward whose logits would pass this computes them "
        "over chunks of completion positions (default: %(default)s)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        help="how long a request waits for others to share its batch (default: %(default)s)",
    )
    p.add_argument(
        "--max-sequences", type=int, default=4096, help="sequences per request (default: %(default)s)"
    )
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads, 0 = torch's default")
    add_serving_arguments(p, port=50053, metrics_port=9102, rpc_threads=16)
    args = p.parse_args(argv)
    names = [name for name, _ in args.teacher]
    if len(set(names)) != len(names):
        p.error(f"--teacher: a name given twice in {names}")
    for name, path in args.teacher:
        if not (path / "config.json").is_file():
            p.error(f"--teacher {name}: {path} is not a model directory (no config.json)")
    for flag in ("max_batch_sequences", "max_batch_tokens", "max_sequences", "rpc_threads"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.memory_budget_mb <= 0 or args.max_wait_ms < 0 or args.torch_threads < 0:
        p.error("--memory-budget-mb must be positive, --max-wait-ms and --torch-threads not negative")
    if not args.logits_chunk_mib > 0:
        p.error(f"--logits-chunk-mib must be positive (got {args.logits_chunk_mib})")
    return args


def serve(args: argparse.Namespace) -> int:
    import torch

    from cascade_proto.v1 import teacher_pb2_grpc
    from services.teacher.batching import ScoringBatcher
    from services.teacher.metrics import TeacherMetrics
    from services.teacher.pool import TeacherPool
    from services.teacher.server import SERVICE_NAME, TeacherServicer

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    metrics = TeacherMetrics()
    pool = TeacherPool(
        dict(args.teacher),
        memory_budget_bytes=int(args.memory_budget_mb * 2**20),
        dtype=args.dtype,
        device=args.device,
    )

    def on_batch(teacher: str, requests: int, sequences: int) -> None:
        metrics.batch_requests.observe(requests)
        metrics.batch_sequences.observe(sequences)

    batcher = ScoringBatcher(
        pool,
        max_batch_sequences=args.max_batch_sequences,
        max_batch_tokens=args.max_batch_tokens,
        logits_chunk_bytes=int(args.logits_chunk_mib * 2**20),
        max_wait_s=args.max_wait_ms / 1000,
        on_batch=on_batch,
    )
    servicer = TeacherServicer(pool, batcher, metrics, max_sequences=args.max_sequences)
    serve_grpc(
        args,
        start_metrics_port(args, metrics.registry),
        lambda s: teacher_pb2_grpc.add_TeacherServiceServicer_to_server(servicer, s),
        service_name=SERVICE_NAME,
        thread_prefix="teacher-rpc",
        log=log,
        ready=lambda port, metrics_port: (
            f"teacher service on {args.host}:{port} (metrics on :{metrics_port}): teachers "
            f"{', '.join(pool.names()) or 'none (SetTeacher adds them)'}, budget "
            f"{args.memory_budget_mb:.0f} MiB, forwards of at most {args.max_batch_tokens} tokens and "
            f"{args.logits_chunk_mib:g} MiB of logits, {args.device}"
        ),
    )
    batcher.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_service(parse_args, serve, argv)


if __name__ == "__main__":
    sys.exit(main())

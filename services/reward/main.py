"""`cascade-reward` / `python -m services.reward.main`: the reward service's gRPC front.

Arguments are parsed before gRPC, Celery and the verifiers are imported, so `--help` and bad
flags answer at once. Workers are separate processes:
`celery -A services.reward.tasks worker --concurrency N` (see docs/services/reward.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from services.entry import add_serving_arguments, run_service, serve_grpc, start_metrics_port

log = logging.getLogger("cascade.reward")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="cascade-reward", description=__doc__.splitlines()[0])
    add_serving_arguments(p, port=50051, metrics_port=9100, rpc_threads=32)
    p.add_argument(
        "--broker-url",
        default=env.get("CASCADE_REWARD_BROKER_URL", "redis://127.0.0.1:6379/0"),
        help="Celery broker (env CASCADE_REWARD_BROKER_URL, which keeps a password out of `ps`; "
        "default: redis://127.0.0.1:6379/0)",  # not %(default)s: --help would print the env's password
    )
    p.add_argument(
        "--result-backend",
        default=env.get("CASCADE_REWARD_RESULT_BACKEND") or None,
        help="Celery result backend (env CASCADE_REWARD_RESULT_BACKEND; default: the broker)",
    )
    p.add_argument(
        "--remote-domains",
        default="code,rlhf",
        help="comma-separated domains scored by the Celery workers; the rest are scored in this "
        "process (default: %(default)s)",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=1,
        help="items per Celery task (default: %(default)s: a slow item holds one worker process, "
        "never its neighbours)",
    )
    p.add_argument(
        "--task-timeout-s",
        type=float,
        default=300.0,
        help="wait for a batch's tasks before answering infra_error (default: %(default)s)",
    )
    p.add_argument(
        "--max-items", type=int, default=4096, help="largest batch accepted (default: %(default)s)"
    )
    p.add_argument(
        "--local-workers",
        type=int,
        default=None,
        help="processes scoring the domains not sent to the Celery workers (default: one per core, "
        "at most 8; 0 scores them in the RPC threads, where a slow verifier stalls every RPC)",
    )
    p.add_argument(
        "--item-timeout-s",
        type=float,
        default=30.0,
        help="one item's scoring time, in a local process or on a Celery worker (an agent episode: "
        "all its tool calls), before it is stopped and judged `timeout` (math in a local process: "
        "its reward's timeout_s + 2 instead; default: %(default)s)",
    )
    p.add_argument(
        "--python-reward",
        action="append",
        default=[f for f in env.get("CASCADE_REWARD_PYTHON_FUNCTIONS", "").split(",") if f.strip()],
        metavar="MODULE:FUNCTION",
        help="a user's reward function this service may call for `verifier: python` domains "
        "(repeatable; env CASCADE_REWARD_PYTHON_FUNCTIONS, comma-separated). A request naming any "
        "other is refused: a client never makes the service import what its operator did not list",
    )
    p.add_argument(
        "--python-reward-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory put first on the import path of the listed reward functions (repeatable; a "
        "request's own `python_path` is never used: the client does not choose what this host imports)",
    )
    args = p.parse_args(argv)
    args.python_reward = frozenset(f.strip() for f in args.python_reward)
    domains = {"math", "code", "if", "swe", "rlhf", "agent", "python"}
    args.remote_domains = frozenset(d.strip() for d in args.remote_domains.split(",") if d.strip())
    if not args.remote_domains <= domains:
        p.error(
            f"--remote-domains: unknown {sorted(args.remote_domains - domains)}; "
            f"expected some of {sorted(domains)}"
        )
    for name in ("chunk_size", "max_items", "rpc_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.task_timeout_s <= 0:
        p.error("--task-timeout-s must be positive")
    if args.item_timeout_s <= 0:
        p.error("--item-timeout-s must be positive")
    if args.local_workers is not None and args.local_workers < 0:
        p.error("--local-workers must be 0 or more")
    return args


def serve(args: argparse.Namespace) -> int:
    from cascade.domains.worker_pool import default_size
    from cascade_proto.v1 import reward_pb2_grpc
    from services.reward import tasks
    from services.reward.batch import DomainCache
    from services.reward.local import InProcess, LocalScoring, PooledScoring
    from services.reward.metrics import RewardMetrics
    from services.reward.scoring import DispatchConfig, Dispatcher
    from services.reward.server import SERVICE_NAME, RewardServicer

    celery_app = tasks.configure(
        tasks.celery_settings(broker_url=args.broker_url, result_backend=args.result_backend)
    )
    metrics = RewardMetrics()
    workers = default_size(cap=8) if args.local_workers is None else args.local_workers
    local: LocalScoring
    if workers:
        pooled = PooledScoring(workers, item_timeout_s=args.item_timeout_s)
        pooled.start()  # before the health check says SERVING
        local = pooled
    else:
        local = InProcess(DomainCache(), args.chunk_size)
    dispatcher = Dispatcher(
        DispatchConfig(
            remote_domains=args.remote_domains,
            chunk_size=args.chunk_size,
            task_timeout_s=args.task_timeout_s,
            item_budget_s=args.item_timeout_s,
        ),
        celery_app,
        local,
    )
    servicer = RewardServicer(
        dispatcher,
        metrics,
        max_items=args.max_items,
        python_functions=args.python_reward,
        python_path=tuple(args.python_reward_path),
    )
    serve_grpc(
        args,
        start_metrics_port(args, metrics.registry),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        service_name=SERVICE_NAME,
        thread_prefix="reward-rpc",
        log=log,
        ready=lambda port, metrics_port: (
            f"reward service on {args.host}:{port} (metrics on :{metrics_port}); remote domains: "
            f"{','.join(sorted(args.remote_domains)) or 'none'}; {workers} local scoring processes; "
            f"broker {_redact(args.broker_url)}"
        ),
        max_message_bytes=64 * 1024 * 1024,
    )
    local.close()
    return 0


def _redact(url: str) -> str:
    """The URL without its password (it goes to the log)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"


def main(argv: list[str] | None = None) -> int:
    return run_service(parse_args, serve, argv)


if __name__ == "__main__":
    sys.exit(main())

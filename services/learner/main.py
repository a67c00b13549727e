"""`cascade-learner` / `python -m services.learner.main`: the learner of the distributed mode.

Runs a cascade config's stages with rollouts from the rollout workers (Redis streams), weights
pushed to every rollout replica (a list and/or a DNS name resolved at each push), teacher
log-probs from the teacher service, and stage state, metrics, evals and checkpoints in the store
(Postgres with `--db`). Arguments are parsed before torch or transformers are imported, so
`--help` and bad flags answer at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from cascade.cli.flags import add_cascade_id_flag, add_start_flags, device_arg, track_arg

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
EXIT_DEPENDENCY_DOWN = 75
"""EX_TEMPFAIL: a dependency (database, Redis, teacher, rollout) stayed unreachable past its
`resilience.*_s` bound; the run is resumable once it is back."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cascade-learner", description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path, help="cascade YAML file")
    p.add_argument(
        "--run-dir", type=Path, help="checkpoints, weights, teachers (default: <output_dir>/<name>)"
    )
    # a URL with a password may come from the environment: a command line is shown by `ps` to all
    p.add_argument(
        "--db",
        default=os.environ.get("CASCADE_LEARNER_DB_URL") or None,
        help="SQLAlchemy URL for stage state and metrics (env CASCADE_LEARNER_DB_URL; default: SQLite "
        "in the run dir)",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("CASCADE_LEARNER_REDIS_URL") or DEFAULT_REDIS_URL,
        help=f"env CASCADE_LEARNER_REDIS_URL; default: {DEFAULT_REDIS_URL}",
    )
    p.add_argument(
        "--stream-prefix", help="Redis key prefix shared with the rollout workers (default: cascade:<name>)"
    )
    p.add_argument(
        "--rollout", help="rollout replica addresses host:port[,host:port...] (weights go to all of them)"
    )
    p.add_argument(
        "--rollout-dns",
        help="NAME:PORT of a headless service, resolved to every replica's address at each weight push",
    )
    p.add_argument(
        "--rollout-wait-s",
        type=float,
        default=60.0,
        help="at start, wait this long for every listed replica to answer (default: %(default)s)",
    )
    p.add_argument("--teacher", help="teacher service address host:port (needed when a stage distils)")
    p.add_argument(
        "--reward",
        help="reward service address host:port: code and swe evals are scored there, in its sandbox "
        "(default: by the learner itself, which then needs bubblewrap)",
    )
    p.add_argument("--no-distill", action="store_true", help="ablation: no distillation in any stage")
    add_start_flags(p, exclusive=True)
    add_cascade_id_flag(p)
    p.add_argument(
        "--follow", action="store_true", help="when paused by an operator, wait for resume or abort (stay up)"
    )
    p.add_argument(
        "--device",
        type=device_arg,
        help="where the learner trains: auto, cpu, cuda, cuda:N (overrides the config's learner.device)",
    )
    p.add_argument(
        "--track",
        type=track_arg,
        help="experiment tracking: tensorboard,mlflow,wandb (any of them) or none; replaces the config's "
        "tracking.backends",
    )
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--host", default="0.0.0.0", help="address of the metrics port (default: %(default)s)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=9400,
        help="HTTP /metrics and /health (SERVING while training; 0 picks a free port)",
    )
    args = p.parse_args(argv)
    if not args.config.is_file():
        p.error(f"config: {args.config} is not a file")
    if not args.rollout and not args.rollout_dns:
        p.error("give --rollout host:port[,host:port...] and/or --rollout-dns NAME:PORT")
    from cascade.transport.rollout_replicas import Addresses

    try:
        Addresses.parse(args.rollout, args.rollout_dns)
    except ValueError as err:
        p.error(str(err))
    if args.torch_threads < 1:
        p.error("--torch-threads must be at least 1")
    if args.cascade_id is not None and args.db is None:
        p.error("--cascade-id needs --db (the control plane's database)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cascade.config import ConfigError, load_cascade_config, with_learner_device, with_tracking

    try:
        cfg = with_learner_device(load_cascade_config(args.config), args.device)
        cfg = with_tracking(cfg, args.track)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    import torch

    torch.set_num_threads(args.torch_threads)
    from cascade.accel import DeviceError
    from cascade.runner.sharded import as_ranks

    try:  # under torchrun: rank 0 runs the loop (`_drive`), the others follow it
        return as_ranks(cfg.learner, cfg.model.dtype, lambda world: _drive(args, cfg, world))
    except DeviceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _drive(args: argparse.Namespace, cfg: Any, world: Any) -> int:
    """Rank 0 (or the only rank): the stage loop over the services."""
    from rich.console import Console

    from cascade.runner.fresh import confirm_fresh
    from cascade.runner.progress import RunProgress
    from cascade.runner.record import read_record, resume_command
    from cascade.runner.run_state import RunDirError
    from cascade.runner.run_store import CascadeMismatch, LeaseHeld
    from cascade.sandbox.pool import SandboxUnavailable
    from cascade.tracking import TrackingUnavailable
    from services.learner.learner import distributed_runner

    def log(line: str) -> None:
        print(line, flush=True)

    run_dir = args.run_dir or cfg.output_dir / cfg.name
    if args.fresh:
        why = confirm_fresh(run_dir, yes=args.yes)
        if why is not None:
            print(f"error: {why}", file=sys.stderr)
            return 2
    db = args.db
    cascade_id = args.cascade_id
    record = read_record(run_dir) if args.resume else None
    if record is not None and db is None and record.db_url_complete:
        db, cascade_id = record.db_url, cascade_id or record.cascade_id
        if db.startswith("sqlite"):
            db, cascade_id = None, None

    from cascade.resilience import DependencyDown
    from cascade.transport.http import start_http_server
    from services.learner.learner import ServiceOutages
    from services.learner.metrics import LearnerMetrics
    from services.learner.replicas import NoReplicaLeft

    metrics = LearnerMetrics()
    outages = ServiceOutages.from_config(cfg.resilience, log)
    metrics.watch(outages.all())
    training = threading.Event()
    http = start_http_server(args.host, args.metrics_port, metrics.registry, health=training.is_set)
    log(f"learner metrics on {args.host}:{http.server_port}")
    try:
        learner = distributed_runner(
            cfg,
            run_dir=run_dir,
            db_url=db,
            distill=not args.no_distill,
            resume=args.resume,
            fresh=args.fresh,
            log=log,
            progress=RunProgress(console=Console(file=sys.stdout), bars=False),
            cascade_id=cascade_id,
            follow=args.follow,
            redis_url=args.redis_url,
            stream_prefix=args.stream_prefix or f"cascade:{cfg.name}",
            rollout=args.rollout,
            rollout_dns=args.rollout_dns,
            rollout_wait_s=args.rollout_wait_s,
            on_replica_failure=metrics.replica_failed,
            outages=outages,
            teacher=args.teacher,
            reward=args.reward,
            on_step=metrics.observe,
            world=world,
        )
    # ValueError: also a DeviceError
    except (RunDirError, TrackingUnavailable, CascadeMismatch, LeaseHeld, ValueError) as err:
        http.shutdown()
        print(f"error: {err}", file=sys.stderr)
        return 2
    metrics.watch([learner.store.database])  # the loop's store rides out database outages too
    training.set()
    try:
        result = learner.run()
    except (RunDirError, TrackingUnavailable, CascadeMismatch, LeaseHeld, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (DependencyDown, NoReplicaLeft) as err:  # past resilience.*, or --rollout-wait-s at start
        hint = resume_command(args.config, run_dir, read_record(run_dir), embedded=False)
        print(f"error: learner stopped: {err}; continue with: {hint}", file=sys.stderr, flush=True)
        return EXIT_DEPENDENCY_DOWN
    except KeyboardInterrupt:
        log(
            "learner interrupted; continue with: "
            + resume_command(args.config, run_dir, read_record(run_dir), embedded=False)
        )
        return 130
    finally:
        training.clear()
        learner.close()
        http.shutdown()
    if result.stopped_by in ("paused", "interrupted"):
        hint = resume_command(args.config, run_dir, read_record(run_dir), embedded=False)
        log(f"learner stopped ({result.stopped_by}); continue with: {hint}")
    elif result.stopped_by == "aborted":
        log("learner done (aborted by an operator)")
    elif result.stopped_by == "failed":
        log("learner done (failed): see the stage's events")
        return 1
    elif result.stopped_by == "lease lost":
        log("learner stopped: another runner took this cascade over")
        return 1
    else:
        log(f"learner done ({result.stopped_by}); report: {result.report_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

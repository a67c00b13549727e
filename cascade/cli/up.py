"""`cascade up`: the distributed mode as local processes (the stack itself is `cascade.up`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cascade.cli.common import fail
from cascade.cli.run import resolve_run_flags


def cmd_up(args: argparse.Namespace) -> int:
    from cascade.config import ConfigError, load_cascade_config, with_tracking
    from cascade.tracking import check_tracking

    try:
        cfg = with_tracking(load_cascade_config(args.config), args.track)
    except ConfigError as err:
        return fail(str(err))
    from cascade.config import preflight_problems

    # what `cascade validate` says (paths, output directory, context, chat template): before any
    # process starts
    given_run_dir = Path(args.run_dir) if args.run_dir else None
    problems = preflight_problems(cfg, run_dir=given_run_dir) + check_tracking(cfg.tracking)
    for line in problems:
        print(f"error: {args.config}: {line}", file=sys.stderr)
    if problems:
        return 2
    import signal
    import uuid

    from cascade.up.stack import LocalStack

    run_dir = Path(args.run_dir) if args.run_dir else cfg.output_dir / f"{cfg.name}-distributed"
    from cascade.up.orphans import orphan_refusal, record_paths
    from cascade.up.preflight import refusal
    from cascade.up.supervisor import RestartBound

    log_dir = Path(args.log_dir or f"{run_dir}-logs")
    # what an earlier `cascade up` of this run left running (an orphan learner trains on): named,
    # with the command that stops it, before anything is asked, written or started
    why = orphan_refusal(record_paths(run_dir, log_dir)) or refusal(
        run_dir, db_url=args.db, cascade_id=args.cascade_id, resume=args.resume, fresh=args.fresh
    )
    if why is not None:
        return fail(f"{why}; nothing was started")
    try:
        bound = RestartBound(max_restarts=args.max_restarts, window_s=args.restart_window_s)
    except ValueError as err:
        return fail(str(err))
    flags_error = resolve_run_flags(args, run_dir)
    if flags_error is not None:
        return fail(flags_error)
    if args.rollout_replicas < 1:
        return fail("--rollout-replicas must be at least 1")
    if args.learner_ranks < 1:
        return fail("--learner-ranks must be at least 1")
    from cascade.cli.engine import engine_launch, vllm_settings
    from cascade.config import VllmEngineConfig

    try:
        vllm = vllm_settings(args, cfg.model.path) if args.engine == "vllm" else VllmEngineConfig()
    except ValueError as err:
        return fail(str(err))
    # the Celery workers need the code sandbox only to score code: without such a domain, a host
    # without bubblewrap still runs them (else they would exit at every start)
    runs_code = bool({d.name for d in cfg.domains} & {"code", "swe"})
    celery_env = {} if runs_code else {"CASCADE_REWARD_SANDBOX_CHECK": "0"}
    stack = LocalStack(
        config=Path(args.config).resolve(),
        model=cfg.model.path.resolve(),
        run_dir=run_dir.resolve(),
        log_dir=log_dir.resolve(),
        redis_url=args.redis_url,
        db=args.db,
        stream_prefix=args.stream_prefix or f"cascade:{cfg.name}:{uuid.uuid4().hex[:8]}",
        workers=args.workers,
        rollout_replicas=args.rollout_replicas,
        learner_ranks=args.learner_ranks,
        celery_workers=args.celery_workers,
        fresh=args.fresh,
        resume=args.resume,
        cascade_id=args.cascade_id,
        follow=not args.no_follow,
        distill=not args.no_distill,
        nice=args.nice,
        track=args.track,
        engine=args.engine,
        vllm=vllm,
        supervise=True,
        restart_bound=bound,
        process_env=celery_env,
        launch_extra=engine_launch(args.engine, vllm, args.vllm_python),
    )
    if args.vllm_python:
        stack.vllm_python = args.vllm_python

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    from cascade.runner.record import public_db_url, public_url
    from cascade.up.supervisor import GaveUp

    try:
        print(f"starting services (logs in {stack.log_dir}) ...", flush=True)
        stack.start_services()
        for i in range(stack.workers):
            stack.worker(i)
        stack.start_learner()
        print(stack.describe(), flush=True)
        db = public_db_url(args.db) if args.db else "SQLite in the run dir"
        print(f"redis {public_url(args.redis_url)} (streams {stack.stream_prefix}:*), db {db}")
        print(
            f"dead processes are restarted (each up to {bound.max_restarts} times within "
            f"{bound.window_s:g}s), the learner is not; Ctrl-C stops them all",
            flush=True,
        )
        code = stack.wait(echo=True)
        if code != 0:
            code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
            learner = stack.procs["learner"]
            from cascade.runner.checkpoint import latest_checkpoint

            if latest_checkpoint(stack.run_dir / "checkpoints") is not None:
                then = (
                    "only --resume continues the run without losing anything (from its last "
                    "checkpoint; the steps after it are redone)"
                )
            else:
                then = "it wrote no checkpoint: there is nothing to resume"
            print(
                f"error: the learner (pid {learner.pid}) ended: {learner.exit_status()} (its log: "
                f"{learner.log_path}); cascade up does not restart it: {then}",
                file=sys.stderr,
            )
    except KeyboardInterrupt:
        print("\nstopping ...", file=sys.stderr)
        code = 130
    except GaveUp as err:
        print(f"error: {err}; stopping the stack", file=sys.stderr)
        code = 1
    except Exception as err:  # a service that could not start, a full disk, ...: the hint below
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        code = 1
    finally:
        stack.stop()
    print(f"all stopped (exit code {code})", file=sys.stderr)
    if code != 0:
        print(_up_hint(args, run_dir, stack), file=sys.stderr)
    return code


def _up_hint(args: argparse.Namespace, run_dir: Path, stack) -> str:  # stack: LocalStack
    """The command that restarts the stack as it was: `--resume` once the learner wrote a
    checkpoint to resume from, else the command that starts over (nothing was trained that a
    resume would keep; `--fresh` when the run directory holds what this attempt wrote)."""
    from cascade.cli.run import restart_hint
    from cascade.runner.checkpoint import latest_checkpoint
    from cascade.runner.record import read_record, resume_command

    try:
        resumable = latest_checkpoint(stack.run_dir / "checkpoints") is not None
        if resumable:
            stack.record_launch()  # run.json carries the launch too (the learner may not have waited)
        record = read_record(stack.run_dir) if resumable else None
    except (OSError, ValueError):
        record = None
    if record is None:
        return restart_hint(args, run_dir, embedded=False)
    record.launch = stack.launch()
    # absolute paths: the command works from any directory (pasted at 3 a.m. elsewhere)
    return f"continue with: {resume_command(stack.config, stack.run_dir, record, embedded=False)}"

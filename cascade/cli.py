"""The `cascade` command. Arguments are parsed before anything heavy is imported, so `--help`
and config validation are instant; torch and transformers load only for real work."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _quiet_hub_progress() -> None:
    """Our own progress bars say what is happening; transformers' per-load bars are noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def cmd_validate(args: argparse.Namespace) -> int:
    from cascade.config import ConfigError, check_paths, load_cascade_config
    from cascade.tracking import check_tracking

    status = 0
    for path in args.configs:
        try:
            cfg = load_cascade_config(path)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            status = 2
            continue
        problems = [] if args.schema_only else check_paths(cfg) + check_tracking(cfg.tracking)
        if not args.schema_only:
            from cascade.runner.step_memory import step_memory_problems

            problems += step_memory_problems(cfg)
        for problem in problems:
            print(f"error: {path}: {problem}", file=sys.stderr)
        if problems:
            status = 2
            continue
        print(f"ok: {path} ({cfg.name}: {' -> '.join(s.label for s in cfg.stages)})")
    return status


def _run_dir(args: argparse.Namespace, cfg) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    suffix = "" if not args.no_distill else "-no-distill"
    return cfg.output_dir / f"{cfg.name}{suffix}"


def _resolve_run_flags(args: argparse.Namespace, run_dir: Path) -> str | None:
    """Check --fresh/--resume/--cascade-id/--db together; on --resume, take the database and
    cascade id the run directory recorded when they were not given. None when all is well."""
    from cascade.runner.fresh import confirm_fresh
    from cascade.runner.record import read_record

    if args.fresh and args.resume:
        return "--fresh and --resume exclude each other"
    if args.fresh:
        why = confirm_fresh(run_dir, yes=args.yes)
        if why is not None:
            return why
    record = read_record(run_dir) if args.resume else None
    if record is not None and args.db is None and not record.db_url.startswith("sqlite"):
        if not record.db_url_complete:
            return f"{run_dir} was run on {record.db_url}: give --db with its password to resume"
        args.db = record.db_url
        args.cascade_id = args.cascade_id or record.cascade_id
    if args.cascade_id is not None and args.db is None:
        return "--cascade-id needs --db (the control plane's database)"
    return None


def _config_for_run(args: argparse.Namespace):  # -> CascadeConfig; raises ConfigError
    """The YAML given; without one, the config the control plane stored for `--cascade-id`, or
    the one the run directory recorded (`--resume --run-dir`)."""
    from cascade.config import CascadeConfig, ConfigError, load_cascade_config

    if args.config is not None:
        return load_cascade_config(args.config)
    if args.cascade_id is not None and args.db is not None:
        from cascade.runner.run_store import CascadeMismatch, stored_config

        try:
            return stored_config(args.db, args.cascade_id)
        except CascadeMismatch as err:
            raise ConfigError(str(err)) from None
    if args.resume and args.run_dir:
        from cascade.runner.record import read_record

        record = read_record(Path(args.run_dir))
        if record is not None:
            return CascadeConfig.model_validate(record.config)
        raise ConfigError(f"{args.run_dir}: no run.json to resume from (give the config)")
    raise ConfigError(
        "a config is needed: a YAML file, or --db with --cascade-id, or --resume with --run-dir"
    )


def cmd_run(args: argparse.Namespace) -> int:
    from cascade.config import ConfigError

    try:
        cfg = _config_for_run(args)
    except ConfigError as err:
        return _fail(str(err))
    if args.seed is not None:
        cfg = cfg.model_copy(update={"seed": args.seed})
    from cascade.config import with_learner_device

    cfg = with_learner_device(cfg, args.device)
    from cascade.config import with_tracking

    cfg = with_tracking(cfg, args.track)
    if args.nproc < 1:
        return _fail("--nproc must be at least 1")
    from cascade.accel import DeviceError
    from cascade.parallel.launch import relaunch, without_option
    from cascade.parallel.world import World
    from cascade.runner.sharded import as_ranks

    def drive(world: World) -> int:
        run_dir = _run_dir(args, cfg)
        flags_error = _resolve_run_flags(args, run_dir)
        if flags_error is not None:
            return _fail(flags_error)
        if args.nproc > 1 and not world.sharded:
            argv = without_option(args.argv, "--nproc") + (["--yes"] if args.fresh and not args.yes else [])
            return relaunch(args.nproc, "cascade.cli", argv)  # --fresh was confirmed here already
        return _run_embedded(args, cfg, run_dir, world)

    try:
        return as_ranks(cfg.learner, cfg.model.dtype, drive)
    except DeviceError as err:
        return _fail(str(err))


def _run_embedded(args: argparse.Namespace, cfg, run_dir: Path, world) -> int:
    from cascade.config import check_paths

    missing = check_paths(cfg)
    if missing:  # what `cascade validate` says, before anything is written
        for line in missing:
            print(f"error: {args.config or 'config'}: {line}", file=sys.stderr)
        return 2

    from rich.console import Console

    _quiet_hub_progress()
    from cascade.accel import DeviceError
    from cascade.model.loading import ModelLoadError
    from cascade.runner.embedded import RunDirError, embedded_runner
    from cascade.runner.progress import RunProgress
    from cascade.runner.record import read_record, resume_command
    from cascade.runner.report import print_regression_table
    from cascade.runner.run_store import CascadeMismatch, LeaseHeld
    from cascade.sandbox.pool import SandboxUnavailable

    console = Console(stderr=True)
    progress = RunProgress(enabled=not args.no_progress, console=console)
    try:
        runner = embedded_runner(
            cfg,
            run_dir=run_dir,
            world=world,
            db_url=args.db,
            distill=not args.no_distill,
            resume=args.resume,
            fresh=args.fresh,
            log=progress.log,
            progress=progress,
            stop_after_steps=args.stop_after_steps,
            cascade_id=args.cascade_id,
            follow=args.follow,
        )
        result = runner.run()
    except (RunDirError, ModelLoadError, CascadeMismatch, LeaseHeld, SandboxUnavailable, DeviceError) as err:
        return _fail(str(err))
    except KeyboardInterrupt:
        progress.stop()
        hint = resume_command(args.config, run_dir, read_record(run_dir), embedded=True)
        print(f"interrupted; continue with: {hint}", file=sys.stderr)
        return 130
    except Exception as err:
        if not _is_outage(err):
            raise
        progress.stop()  # a database, disk or Redis error: what broke, and how to go on once it is back
        hint = resume_command(args.config, run_dir, read_record(run_dir), embedded=True)
        print(f"error: the run stopped: {_one_line(err)}", file=sys.stderr)
        print(f"continue with (once that is fixed): {hint}", file=sys.stderr)
        return 1
    if result.stopped_by == "aborted":
        print("run aborted by an operator", file=sys.stderr)
        return 0
    if result.stopped_by == "failed":
        print("run failed: see the stage's events (cascade api show)", file=sys.stderr)
        return 1
    if result.stopped_by == "lease lost":
        print("stopped: another runner took this cascade over", file=sys.stderr)
        return 1
    if result.stopped_by in ("paused", "interrupted"):
        hint = resume_command(args.config, run_dir, read_record(run_dir), embedded=True)
        if result.stopped_by == "paused":  # the pause is state: a resumed runner waits until it is lifted
            hint += "   (after `cascade stage resume`; or add --follow to wait for it)"
        print(f"run {result.stopped_by}; continue with: {hint}", file=sys.stderr)
        return 0
    print_regression_table(result.report_dir)
    print(f"report: {result.report_dir}")
    return 0


def _is_outage(err: BaseException) -> bool:
    """An error of what the run depends on (database, disk, Redis), not of the code: the run
    resumes from its last checkpoint once it is fixed."""
    from sqlalchemy.exc import SQLAlchemyError

    from cascade.resilience import DependencyDown

    if isinstance(err, OSError | SQLAlchemyError | DependencyDown):
        return True
    return any(cls.__module__.startswith("redis") for cls in type(err).__mro__)


def _one_line(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def cmd_model_init(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if (out / "config.json").exists() and not args.force:
        print(f"{out} already holds a model (use --force to rebuild)")
        return 0
    _quiet_hub_progress()
    import dataclasses

    from cascade.bootstrap.policy import REWARD_MODEL_SUBDIR, SPECS, build_tiny_model

    spec = dataclasses.replace(SPECS[args.spec], seed=args.seed)
    if args.max_steps is not None:
        cap = args.max_steps
        spec = dataclasses.replace(spec, max_steps=cap, min_steps=min(cap, spec.min_steps))
    reward_model = None
    if "rlhf" in spec.domains:
        from cascade.bootstrap.reward_model import build_tiny_reward_model

        reward_model = out / REWARD_MODEL_SUBDIR
        if args.force or not (reward_model / "config.json").exists():
            build_tiny_reward_model(reward_model, seed=args.seed)
    result = build_tiny_model(out, spec, reward_model=reward_model)
    print(
        f"saved {out} after {result.steps} SFT steps ({result.stopped_by}): "
        + ", ".join(f"{k} {v:.0%}" for k, v in result.final_scores.items())
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from cascade.runner.report import print_regression_table

    report = Path(args.run_dir) / "report"
    if not (report / "regression_table.json").exists():
        return _fail(f"{args.run_dir}: no report yet (the run has not finished)")
    print_regression_table(report)
    return 0


def cmd_sandbox_check(args: argparse.Namespace) -> int:
    from cascade.sandbox import preflight
    from cascade.sandbox.pool import BwrapSettings

    checks = preflight.check(BwrapSettings(uid=args.uid))
    print(preflight.format_report(checks))
    if all(c.ok for c in checks if c.required):
        return 0
    print(preflight.KUBERNETES_NEEDS)
    return 1


def cmd_up(args: argparse.Namespace) -> int:
    from cascade.config import ConfigError, load_cascade_config, with_tracking
    from cascade.tracking import check_tracking

    try:
        cfg = with_tracking(load_cascade_config(args.config), args.track)
    except ConfigError as err:
        return _fail(str(err))
    from cascade.config import check_paths

    problems = check_paths(cfg) + check_tracking(cfg.tracking)  # before any process starts
    for line in problems:
        print(f"error: {args.config}: {line}", file=sys.stderr)
    if problems:
        return 2
    import signal
    import uuid

    from cascade.up import LocalStack

    run_dir = Path(args.run_dir) if args.run_dir else cfg.output_dir / f"{cfg.name}-distributed"
    from cascade.up_preflight import refusal
    from cascade.up_supervisor import RestartBound

    why = refusal(run_dir, db_url=args.db, cascade_id=args.cascade_id, resume=args.resume, fresh=args.fresh)
    if why is not None:  # before anything is asked, written or started
        return _fail(f"{why}; nothing was started")
    try:
        bound = RestartBound(max_restarts=args.max_restarts, window_s=args.restart_window_s)
    except ValueError as err:
        return _fail(str(err))
    flags_error = _resolve_run_flags(args, run_dir)
    if flags_error is not None:
        return _fail(flags_error)
    if args.rollout_replicas < 1:
        return _fail("--rollout-replicas must be at least 1")
    if args.learner_ranks < 1:
        return _fail("--learner-ranks must be at least 1")
    from cascade.cli_engine import engine_launch, vllm_settings
    from cascade.config import VllmEngineConfig

    try:
        vllm = vllm_settings(args, cfg.model.path) if args.engine == "vllm" else VllmEngineConfig()
    except ValueError as err:
        return _fail(str(err))
    # the Celery workers need the code sandbox only to score code: without such a domain, a host
    # without bubblewrap still runs them (else they would exit at every start)
    runs_code = bool({d.name for d in cfg.domains} & {"code", "swe"})
    celery_env = {} if runs_code else {"CASCADE_REWARD_SANDBOX_CHECK": "0"}
    stack = LocalStack(
        config=Path(args.config).resolve(),
        model=cfg.model.path.resolve(),
        run_dir=run_dir.resolve(),
        log_dir=Path(args.log_dir or f"{run_dir}-logs").resolve(),
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
    from cascade.up_supervisor import GaveUp

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
            print(
                f"error: the learner (pid {learner.pid}) ended: {learner.exit_status()} (its log: "
                f"{learner.log_path}); cascade up does not restart it: only --resume continues the run "
                "without losing anything (from its last checkpoint; the steps after it are redone)",
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
    """The command that restarts the stack as it was: `--resume` once the learner recorded a
    run, else the same command again (nothing was trained)."""
    import shlex

    from cascade.runner.record import read_record, resume_command

    try:
        stack.record_launch()  # run.json carries the launch too (the learner may not have waited)
        record = read_record(stack.run_dir)
    except (OSError, ValueError):
        record = None
    if record is None:
        return f"no run recorded in {run_dir} (nothing trained yet); start again with: " + shlex.join(
            ["cascade", *getattr(args, "argv", [])]
        )
    record.launch = stack.launch()
    # absolute paths: the command works from any directory (pasted at 3 a.m. elsewhere)
    return f"continue with: {resume_command(stack.config, stack.run_dir, record, embedded=False)}"


def track_arg(value: str) -> list[str]:
    """`--track`: tracking backends, comma-separated (tensorboard, mlflow, wandb), or none."""
    from cascade.config.tracking import parse_track_flag

    try:
        return list(parse_track_flag(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def device_arg(value: str) -> str:
    """`--device`: auto, cpu, cuda or cuda:N (whether this host has it is checked at start)."""
    from cascade.config import device_setting

    try:
        return device_setting(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cascade", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a cascade in one process (embedded mode)")
    p.add_argument(
        "config",
        nargs="?",
        help="cascade YAML file (optional with --db and --cascade-id: the config the control plane "
        "stored; or with --resume --run-dir: the one the run recorded)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="move the run directory aside (<run>.old-<time>) and start over (asks; see --yes)",
    )
    p.add_argument("--yes", action="store_true", help="with --fresh: move it aside without asking")
    p.add_argument("--no-distill", action="store_true", help="ablation: no distillation in any stage")
    p.add_argument("--run-dir", help="default: <output_dir>/<name>[-no-distill]")
    p.add_argument("--db", help="SQLAlchemy URL for stage state and metrics (default: SQLite in the run dir)")
    p.add_argument("--seed", type=int, help="override the config's seed")
    p.add_argument(
        "--device",
        type=device_arg,
        help="where the learner trains: auto, cpu, cuda, cuda:N (overrides the config's learner.device)",
    )
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")
    p.add_argument(
        "--track",
        type=track_arg,
        help="experiment tracking: tensorboard,mlflow,wandb (any of them) or none; replaces the config's "
        "tracking.backends",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="train on N ranks of this host (torchrun; the policy sharded with FSDP2; default: 1)",
    )
    p.add_argument("--stop-after-steps", type=int, help="checkpoint and stop after N steps (resume later)")
    p.add_argument("--cascade-id", type=int, help="run a cascade created through the control plane (in --db)")
    p.add_argument(
        "--follow", action="store_true", help="when paused by an operator, wait for resume or abort"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("up", help="run a cascade in distributed mode as local processes")
    p.add_argument("config", help="cascade YAML file")
    p.add_argument("--db", help="SQLAlchemy URL, e.g. postgresql+psycopg://postgres@127.0.0.1:5432/cascade")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="streams + Celery broker")
    p.add_argument("--run-dir", help="default: <output_dir>/<name>-distributed")
    p.add_argument("--log-dir", help="one log per process (default: <run-dir>-logs)")
    p.add_argument("--stream-prefix", help="Redis key prefix of this run (default: a fresh one)")
    p.add_argument("--workers", type=int, default=2, help="rollout workers (default: %(default)s)")
    p.add_argument("--celery-workers", type=int, default=1, help="Celery reward workers (default: 1)")
    p.add_argument(
        "--rollout-replicas",
        type=int,
        default=1,
        help="rollout service processes: weights pushed to all, requests spread over them (default: 1)",
    )
    p.add_argument(
        "--learner-ranks",
        type=int,
        default=1,
        help="learner processes (torchrun on this host; the policy sharded with FSDP2; default: 1)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="move the run directory aside (<run>.old-<time>) and start over (asks; see --yes)",
    )
    p.add_argument("--yes", action="store_true", help="with --fresh: move it aside without asking")
    p.add_argument("--cascade-id", type=int, help="run a cascade created through the control plane (in --db)")
    p.add_argument(
        "--follow",
        action="store_true",
        default=True,
        help="when paused by an operator, keep the stack up and wait for resume or abort (the default)",
    )
    p.add_argument("--no-follow", action="store_true", help="stop the stack when a stage is paused")
    p.add_argument("--no-distill", action="store_true", help="ablation: no distillation in any stage")
    p.add_argument("--nice", type=int, default=0, help="start every process under `nice -n N`")
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="a process other than the learner that dies is restarted, at most this many times within "
        "--restart-window-s; one more death stops the stack (default: %(default)s)",
    )
    p.add_argument(
        "--restart-window-s",
        type=float,
        default=600.0,
        help="the window of --max-restarts, in seconds (default: %(default)s)",
    )
    from cascade.cli_engine import add_engine_flags

    add_engine_flags(p)
    p.add_argument(
        "--track",
        type=track_arg,
        help="experiment tracking: tensorboard,mlflow,wandb (any of them) or none; replaces the config's "
        "tracking.backends",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "validate", help="validate cascade configs and check that the files and directories they name exist"
    )
    p.add_argument("configs", nargs="+")
    p.add_argument(
        "--schema-only",
        action="store_true",
        help="check the configs only, not the paths they name (e.g. on a host without the model)",
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("model", help="build models")
    msub = p.add_subparsers(dest="model_command", required=True)
    m = msub.add_parser("init", help="train the tiny tokenizer + model locally")
    m.add_argument("--out", default="models/tiny")
    m.add_argument(
        "--spec",
        choices=("tiny", "full", "agent"),
        default="tiny",
        help="tiny: math, code, if (the demo's model); full: rlhf, if, math, code, swe, plus the tiny "
        "reward model rlhf needs, in <out>/reward_model; agent: math, code and tool-call traces "
        "(single-token tool markers, 512 positions)",
    )
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--force", action="store_true")
    m.add_argument("--max-steps", type=int, help="cap SFT steps (tests build a quick, weaker model)")
    m.set_defaults(func=cmd_model_init)

    p = sub.add_parser("report", help="print a finished run's regression table")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("sandbox", help="the code sandbox")
    ssub = p.add_subparsers(dest="sandbox_command", required=True)
    s = ssub.add_parser("check", help="check what the bubblewrap sandbox needs from this host")
    s.add_argument("--uid", type=int, default=61000, help="sandbox uid when running as root")
    s.set_defaults(func=cmd_sandbox_check)
    from cascade import cli_api, cli_data

    cli_api.add_parsers(sub)
    cli_data.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())

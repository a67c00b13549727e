"""`cascade validate`, `cascade run` (embedded mode, on one or several ranks) and `cascade report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cascade.cli.common import fail, quiet_hub_progress


def cmd_validate(args: argparse.Namespace) -> int:
    from cascade.config import ConfigError, load_cascade_config, preflight_problems
    from cascade.tracking import check_tracking

    status = 0
    printed = 0
    for path in args.configs:
        try:
            cfg = load_cascade_config(path)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            status = 2
            continue
        problems = [] if args.schema_only else preflight_problems(cfg) + check_tracking(cfg.tracking)
        if not args.schema_only:
            from cascade.runner.step_memory import step_memory_problems

            problems += step_memory_problems(cfg)
        for problem in problems:
            print(f"error: {path}: {problem}", file=sys.stderr)
        if problems:
            status = 2
            continue
        if getattr(args, "print_config", False):
            from cascade.config import dump_cascade_yaml

            # one YAML document per file: `---` before each but the first
            print(("---\n" if printed else "") + f"# {path}, resolved\n" + dump_cascade_yaml(cfg), end="")
            printed += 1
            continue
        print(f"ok: {path} ({cfg.name}: {' -> '.join(s.label for s in cfg.stages)})")
    return status


def _run_dir(args: argparse.Namespace, cfg) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    suffix = "" if not args.no_distill else "-no-distill"
    return cfg.output_dir / f"{cfg.name}{suffix}"


def resolve_run_flags(args: argparse.Namespace, run_dir: Path) -> str | None:
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
        return fail(str(err))
    if args.seed is not None:
        cfg = cfg.model_copy(update={"seed": args.seed})
    from cascade.config import with_learner_device

    cfg = with_learner_device(cfg, args.device)
    from cascade.config import with_tracking

    cfg = with_tracking(cfg, args.track)
    if getattr(args, "print_config", False):  # what the run would use, and nothing run, checked or written
        from cascade.config import dump_cascade_yaml

        print(dump_cascade_yaml(cfg), end="")
        return 0
    if args.nproc < 1:
        return fail("--nproc must be at least 1")
    from cascade.accel import DeviceError
    from cascade.parallel.launch import relaunch, without_option
    from cascade.parallel.world import World
    from cascade.runner.sharded import as_ranks

    def drive(world: World) -> int:
        run_dir = _run_dir(args, cfg)
        flags_error = resolve_run_flags(args, run_dir)
        if flags_error is not None:
            return fail(flags_error)
        if args.nproc > 1 and not world.sharded:
            argv = without_option(args.argv, "--nproc") + (["--yes"] if args.fresh and not args.yes else [])
            return relaunch(args.nproc, "cascade.cli", argv)  # --fresh was confirmed here already
        return _run_embedded(args, cfg, run_dir, world)

    try:
        return as_ranks(cfg.learner, cfg.model.dtype, drive)
    except DeviceError as err:
        return fail(str(err))


def _run_embedded(args: argparse.Namespace, cfg, run_dir: Path, world) -> int:
    from cascade.config import preflight_problems

    # what `cascade validate` says (paths, output directory, context, chat template), before
    # any model is loaded or anything written
    missing = preflight_problems(cfg, run_dir=run_dir if args.run_dir else None)
    if missing:
        for line in missing:
            print(f"error: {args.config or 'config'}: {line}", file=sys.stderr)
        return 2

    from rich.console import Console

    quiet_hub_progress()
    from cascade.accel import DeviceError
    from cascade.model.loading import ModelLoadError
    from cascade.runner.embedded import RunDirError, embedded_runner
    from cascade.runner.progress import RunProgress
    from cascade.runner.record import read_record, resume_command
    from cascade.runner.report import print_regression_table
    from cascade.runner.run_store import CascadeMismatch, LeaseHeld
    from cascade.sandbox.pool import SandboxUnavailable
    from cascade.tracking import TrackingUnavailable

    console = Console(stderr=True)
    progress = RunProgress(console=console, bars=not args.no_progress)
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
    except (RunDirError, TrackingUnavailable, ModelLoadError, CascadeMismatch, LeaseHeld) as err:
        return fail(str(err))
    except (SandboxUnavailable, DeviceError) as err:
        return fail(str(err))
    except KeyboardInterrupt:
        progress.stop()
        print(f"interrupted; {restart_hint(args, run_dir, embedded=True)}", file=sys.stderr)
        return 130
    except Exception as err:
        if not _is_outage(err):
            raise
        progress.stop()  # a database, disk or Redis error: what broke, and how to go on once it is back
        print(f"error: the run stopped: {_one_line(err)}", file=sys.stderr)
        print(restart_hint(args, run_dir, embedded=True, fixed=True), file=sys.stderr)
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


def restart_hint(
    args: argparse.Namespace,
    run_dir: Path,
    *,
    embedded: bool,
    config: str | Path | None = None,
    fixed: bool = False,
) -> str:
    """How to go on after a run stopped: `continue with: <--resume command>` once the run has a
    checkpoint to resume from; before that (nothing trained that a resume would keep: `--resume`
    would be refused), the command that starts it over: with `--fresh` when the run directory
    already holds what this attempt wrote, else the same command again. `config`: the config
    path the resume command names (default: the one given). `fixed`: after an outage (said
    "once that is fixed")."""
    import shlex

    from cascade.runner.checkpoint import latest_checkpoint
    from cascade.runner.record import read_record, resume_command

    config_path = config if config is not None else getattr(args, "config", None)
    try:
        resumable = latest_checkpoint(run_dir / "checkpoints") is not None
        record = read_record(run_dir) if resumable else None
        holds = run_dir.is_dir() and any(run_dir.iterdir())
    except (OSError, ValueError):
        resumable, record, holds = False, None, False
    once = " once that is fixed" if fixed else ""
    if resumable:
        when = " (once that is fixed)" if fixed else ""
        return f"continue with{when}: {resume_command(config_path, run_dir, record, embedded=embedded)}"
    argv = [a for a in getattr(args, "argv", []) if a not in ("--resume", "--fresh", "--yes")]
    words = ["cascade", *argv] if argv else ["cascade", "run" if embedded else "up", str(config_path)]
    if holds:
        words.append("--fresh")
        if not any(a == "--run-dir" or a.startswith("--run-dir=") for a in argv):
            words += ["--run-dir", str(run_dir)]
        return f"nothing to resume (no checkpoint yet); start over{once} with: {shlex.join(words)}"
    return f"nothing was trained; start again{once} with: {shlex.join(words)}"


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


def cmd_report(args: argparse.Namespace) -> int:
    from cascade.runner.report import print_regression_table

    report = Path(args.run_dir) / "report"
    if not (report / "regression_table.json").exists():
        return fail(f"{args.run_dir}: no report yet (the run has not finished)")
    print_regression_table(report)
    return 0

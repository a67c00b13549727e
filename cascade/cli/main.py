"""The `cascade` command. Arguments are parsed before anything heavy is imported, so `--help`
and config validation are instant; torch and transformers load only for real work."""

from __future__ import annotations

import argparse
import sys

from cascade.cli.flags import add_cascade_id_flag, add_start_flags, device_arg, track_arg
from cascade.cli.host import cmd_model_init, cmd_sandbox_check
from cascade.cli.run import cmd_report, cmd_run, cmd_validate
from cascade.cli.up import cmd_up


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
    add_start_flags(p)
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
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the config the run would use (defaults filled in, paths absolute, --seed, --device "
        "and --track applied) as YAML, and exit without running",
    )
    add_cascade_id_flag(p)
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
    add_start_flags(p)
    add_cascade_id_flag(p)
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
    from cascade.cli.engine import add_engine_flags

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
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print each config as it is resolved (defaults filled in, paths absolute) as YAML, one "
        "document per file, after its checks; nothing else is printed on stdout",
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
    from cascade.cli import api, data, export

    api.add_parsers(sub)
    data.add_parsers(sub)
    export.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())

"""Command-line flags that `cascade run`, `cascade up` and the learner service (`cascade-learner`)
share: how a run treats its run directory, and argument types that validate through the config
(so a bad `--device` or `--track` answers as the YAML field would). The config is imported only
when such a flag is given: `--help` stays instant."""

from __future__ import annotations

import argparse


def device_arg(value: str) -> str:
    """`--device`: auto, cpu, cuda or cuda:N (whether this host has it is checked at start)."""
    from cascade.config import device_setting

    try:
        return device_setting(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def track_arg(value: str) -> list[str]:
    """`--track`: tracking backends, comma-separated (tensorboard, mlflow, wandb), or none."""
    from cascade.config.tracking import parse_track_flag

    try:
        return list(parse_track_flag(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_start_flags(parser: argparse.ArgumentParser, *, exclusive: bool = False) -> None:
    """`--resume`, `--fresh`, `--yes`: how a run treats a run directory that already holds a run.
    With `exclusive`, argparse itself refuses `--resume --fresh` (otherwise the command does)."""
    mode = parser.add_mutually_exclusive_group() if exclusive else parser
    mode.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    mode.add_argument(
        "--fresh",
        action="store_true",
        help="move the run directory aside (<run>.old-<time>) and start over (asks; see --yes)",
    )
    parser.add_argument("--yes", action="store_true", help="with --fresh: move it aside without asking")


def add_cascade_id_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cascade-id", type=int, help="run a cascade created through the control plane (in --db)"
    )

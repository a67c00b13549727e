"""`cascade export RUN_DIR OUT_DIR [--checkpoint latest|best:<domain>|step-N] [--force]`: one of a
run's checkpoints as a plain Hugging Face model directory, without optimizer, RNG or runner
state (`cascade.runner.export`)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from cascade.cli.common import fail


def _selector(value: str) -> str:
    """`--checkpoint`: latest, best:<domain> or step-N (checked here: torch is not imported to parse)."""
    if value == "latest" or re.fullmatch(r"step-\d+", value) or re.fullmatch(r"best:\S+", value):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not latest, best:<domain> or step-N")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's checkpoint as a plain Hugging Face model directory (no optimizer, runner state)",
        description=__doc__,
    )
    p.add_argument("run_dir", help="the run directory (<output_dir>/<name>)")
    p.add_argument("out_dir", help="the model directory to write (must not exist or be empty; see --force)")
    p.add_argument(
        "--checkpoint",
        type=_selector,
        default="latest",
        help="latest (the newest checkpoint), step-N (that step's), or best:<domain> (the domain's best "
        "checkpoint, the one the run keeps as its distillation teacher) (default: %(default)s)",
    )
    p.add_argument("--force", action="store_true", help="replace OUT_DIR when it exists and is not empty")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from cascade.runner.export import ExportError, export_model

    try:
        done = export_model(Path(args.run_dir), Path(args.out_dir), args.checkpoint, force=args.force)
    except ExportError as err:
        return fail(str(err))
    print(done.describe())
    for note in done.notes:
        print(f"note: {note}")
    return 0

"""What every command module of the CLI shares: the one-line failure and quiet model loads."""

from __future__ import annotations

import sys


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def quiet_hub_progress() -> None:
    """Our own progress bars say what is happening; transformers' per-load bars are noise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

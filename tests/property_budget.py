"""How many examples a property-based test draws: its default in `make test` (derandomized, so a
failure reproduces), times `CASCADE_HYPOTHESIS_SCALE` for the longer run of `make test-properties`
(the nightly-style budget)."""

from __future__ import annotations

import os


def examples(default: int) -> int:
    return max(1, int(default * float(os.environ.get("CASCADE_HYPOTHESIS_SCALE", "1"))))

"""The seeds study's arithmetic (`cascade.runner.seed_study`, `bench/ablation_seeds.py`): the t
interval over seeds and the paired differences, by hand."""

from __future__ import annotations

import math

import pytest

from cascade.eval.stats import t_interval
from cascade.runner.seed_study import own_stage_gains, paired_effects
from cascade.store.history import RegressionRow, RegressionTable


def test_t_interval_by_hand() -> None:
    # mean 2, sd 1, n 3: half width 4.303 * 1 / sqrt(3) = 2.4843
    m, low, high = t_interval([1.0, 2.0, 3.0]) or (0, 0, 0)
    assert m == 2.0
    assert low == pytest.approx(2 - 4.303 / math.sqrt(3)) and high == pytest.approx(2 + 4.303 / math.sqrt(3))
    assert t_interval([5.0]) is None
    m, low, high = t_interval([0.5] * 12) or (0, 0, 0)  # past the table: the normal quantile; sd 0
    assert (m, low, high) == (0.5, 0.5, 0.5)


def _table(math_after: list[float], best: float, final: float) -> RegressionTable:
    row = RegressionRow("math", 0.10, math_after, best, 5, final)
    return RegressionTable(["math", "code"], [row])


def test_paired_differences_and_own_stage_gains() -> None:
    tables = {
        0: {"distill": _table([0.30, 0.28], 0.30, 0.28), "no_distill": _table([0.30, 0.20], 0.30, 0.20)},
        1: {"distill": _table([0.25, 0.24], 0.26, 0.24), "no_distill": _table([0.26, 0.18], 0.26, 0.18)},
        2: {"distill": _table([0.35, 0.30], 0.35, 0.30), "no_distill": _table([0.35, 0.26], 0.35, 0.26)},
    }
    e = paired_effects(tables)["math"]
    # final - best: with -0.02, -0.02, -0.05; without -0.10, -0.08, -0.09 -> differences .08, .06, .04
    assert [round(e["per_seed"][s]["difference"], 6) for s in (0, 1, 2)] == [0.08, 0.06, 0.04]
    assert e["mean_difference"] == pytest.approx(0.06)
    half = 4.303 * 0.02 / math.sqrt(3)  # sd of (.08, .06, .04) is .02
    assert e["interval"] == pytest.approx([0.06 - half, 0.06 + half])
    assert e["outside_noise"] is True  # the interval [0.0103, 0.1097] excludes 0
    gains = own_stage_gains({s: t["distill"] for s, t in tables.items()}, ["math"])
    g = gains["math"]
    assert g["per_seed"] == pytest.approx({0: 0.20, 1: 0.15, 2: 0.25})  # after math minus start 0.10
    assert g["outside_noise"] is True

"""pass@k, Wilson and bootstrap intervals, the noise flag: against hand values and enumeration."""

from __future__ import annotations

import itertools
import math
import random
from math import comb

import pytest

from cascade.eval.stats import (
    bootstrap_interval,
    mean_interval,
    outside_noise,
    pass_at_k,
    wilson_interval,
)


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of k-subsets of n samples (c of them passing) that hold a passing one."""
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (10, 3, 1, 0.3),  # pass@1 is the pass rate
        (4, 2, 4, 1.0),  # n = k: any pass
        (4, 0, 4, 0.0),
        (8, 0, 3, 0.0),  # c = 0
        (8, 8, 3, 1.0),  # c = n
        (8, 6, 3, 1.0),  # n - c < k: every k-subset holds a pass
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_enumeration() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable() -> None:
    # C(10^6, 1000) overflows a float; the product form does not
    value = pass_at_k(1_000_000, 10, 1000)
    exact = 1 - math.exp(sum(math.log1p(-1000 / i) for i in range(1_000_000 - 10 + 1, 1_000_000 + 1)))
    assert value == pytest.approx(exact, rel=1e-12)
    assert 0.0 < value < 1.0
    assert pass_at_k(200, 1, 1) == pytest.approx(1 / 200)
    assert pass_at_k(100_000, 50_000, 100) == pytest.approx(1.0)


def test_pass_at_k_refuses_bad_counts() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)


def test_wilson_known_values() -> None:
    # Wilson (1927) / Newcombe (1998) table: 95%, z = 1.959964
    assert wilson_interval(50, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    narrow, wide = wilson_interval(50, 100, 0.9), wilson_interval(50, 100, 0.99)
    assert wide[0] < narrow[0] and narrow[1] < wide[1]


def test_bootstrap_seeded_and_covers_the_mean() -> None:
    rng = random.Random(0)
    values = [rng.random() for _ in range(200)]
    mean = sum(values) / len(values)
    a = bootstrap_interval(values, seed=7)
    assert a == bootstrap_interval(values, seed=7)  # deterministic
    assert a != bootstrap_interval(values, seed=8)
    assert a[0] < mean < a[1]
    # about the normal approximation's width: 1.96 * sd / sqrt(n), sd of U(0, 1) ~ 0.289
    assert a[1] - a[0] == pytest.approx(2 * 1.96 * 0.289 / math.sqrt(200), rel=0.15)
    assert bootstrap_interval([0.3], seed=0) == (0.3, 0.3)
    assert bootstrap_interval([0.5, 0.5, 0.5], seed=0) == (0.5, 0.5)
    assert all(math.isnan(v) for v in bootstrap_interval([], seed=0))


def test_bootstrap_coverage_is_about_nominal() -> None:
    """Over many samples of a known distribution, the 95% interval covers its mean ~95% of the time."""
    rng = random.Random(1)
    covered = 0
    for trial in range(200):
        values = [rng.betavariate(2, 5) for _ in range(80)]
        lo, hi = bootstrap_interval(values, seed=trial, resamples=500)
        covered += lo <= 2 / 7 <= hi
    assert 0.88 <= covered / 200 <= 0.99


def test_mean_interval_picks_the_method() -> None:
    ci, method = mean_interval([1.0, 0.0, 1.0, 1.0], seed=0)
    assert method == "wilson" and ci == wilson_interval(3, 4)
    ci, method = mean_interval([1.0, 0.5, 0.25, 1.0], seed=0)
    assert method == "bootstrap" and ci[0] <= 0.6875 <= ci[1]


def test_noise_flag() -> None:
    best, close, far = wilson_interval(60, 100), wilson_interval(55, 100), wilson_interval(30, 100)
    assert outside_noise(close, best) is False  # -5 points on 100 prompts: within noise
    assert outside_noise(far, best) is True  # -30 points: the intervals do not overlap
    assert outside_noise(best, best) is False
    assert outside_noise(None, best) is None and outside_noise(far, None) is None
    # the same -5 points on 4000 prompts is outside noise
    assert outside_noise(wilson_interval(2200, 4000), wilson_interval(2400, 4000)) is True

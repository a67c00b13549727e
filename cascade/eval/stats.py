"""Eval estimators and their uncertainty: pass@k, avg@k, and a confidence interval per score.

A paper-ready eval number comes with its noise: 256 prompts at 50% carry about +-6 points at
95% confidence. The rules used everywhere in Cascade (the runner, the report, the API):

- **pass@k** is the unbiased estimator of the Codex paper (Chen et al., 2021) from n >= k
  samples of which c pass: `1 - C(n-c, k) / C(n, k)`, computed as a running product (no huge
  binomials, exact at n = 10^6), averaged over prompts.
- **Intervals** are at `level` (95% by default). When every prompt contributes a 0/1 outcome
  (greedy accuracy on a verifiable domain, pass@k with n = k) the score is a proportion and gets
  the **Wilson score interval**; otherwise (avg@k, pass@k with n > k, the swe partial score, the
  rlhf win rate) it is a mean of per-prompt values and gets a **percentile bootstrap over
  prompts**, seeded, so the same values always give the same interval.
- **Outside noise**: a drop from `best` to `final` is flagged when the two intervals do not
  overlap (final's upper bound below best's lower bound). That is conservative: for equal widths
  it corresponds to a two-sided test at about p < 0.006, so a flagged drop is real, and an
  unflagged one may still be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

Interval = tuple[float, float]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt: `1 - C(n-c, k) / C(n, k)` from `n` samples, `c` passing.

    Computed as `1 - prod_{i=n-c+1..n} (1 - k / i)`, stable for any n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def z_value(level: float) -> float:
    """Two-sided normal quantile for a confidence `level` in (0, 1) (0.95 -> 1.96)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson_interval(successes: float, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval of a proportion `successes / n`; (0, 1) when n is 0."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    z = z_value(level)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


def bootstrap_interval(
    values: Sequence[float], *, seed: int, level: float = 0.95, resamples: int = 2000
) -> Interval:
    """Percentile bootstrap interval of the mean of `values` (one per prompt), resampling prompts.

    Deterministic for a given `seed`. One value gives a zero-width interval; none gives (nan, nan).
    """
    import numpy as np  # only where intervals are computed (the API reads them, never makes them)

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1 or bool(np.all(x == x[0])):
        return (float(x[0]), float(x[0]))
    z_value(level)  # validates the level
    rng = np.random.default_rng(seed & (2**63 - 1))
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def ratio_interval(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    seed: int,
    level: float = 0.95,
    resamples: int = 2000,
) -> Interval:
    """Percentile bootstrap interval of `sum(numerators) / sum(denominators)`, resampling the
    units (tasks) that each contribute one numerator and one denominator (a rate over calls
    whose calls cluster in tasks). Deterministic for a given `seed`; (nan, nan) without data."""
    import numpy as np

    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape:
        raise ValueError(f"{num.size} numerators for {den.size} denominators")
    if num.size == 0 or den.sum() <= 0:
        return (math.nan, math.nan)
    z_value(level)
    rng = np.random.default_rng(seed & (2**63 - 1))
    picks = rng.integers(0, num.size, size=(resamples, num.size))
    sums = den[picks].sum(axis=1)
    ratios = np.where(sums > 0, num[picks].sum(axis=1) / np.where(sums > 0, sums, 1.0), np.nan)
    lo, hi = np.nanquantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def mean_interval(values: Sequence[float], *, seed: int, level: float = 0.95) -> tuple[Interval, str]:
    """The interval of the mean of per-prompt `values` and the method used ("wilson"/"bootstrap")."""
    if values and is_binary(values):
        return wilson_interval(sum(values), len(values), level), "wilson"
    return bootstrap_interval(values, seed=seed, level=level), "bootstrap"


def outside_noise(final: Interval | None, best: Interval | None) -> bool | None:
    """True when `final`'s interval lies wholly below `best`'s (the drop is not noise)."""
    if final is None or best is None:
        return None
    if any(math.isnan(v) for v in (*final, *best)):
        return None
    return final[1] < best[0]


T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t 0.975 quantiles for 1..10 degrees of freedom (a two-sided 95% interval)."""


def t_interval(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): the two-sided 95% t interval of the mean of `values`, over a handful of
    seeds (None below two values; past 11 values the normal quantile 1.96)."""
    if len(values) < 2:
        return None
    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    half = t * sd / math.sqrt(n)
    return m, m - half, m + half

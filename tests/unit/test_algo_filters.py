"""Dynamic filtering: zero-variance groups and the prompt pass-rate filter with readmission."""

from __future__ import annotations

import json
import random

import pytest
import torch

from cascade.algo import PromptPassRateFilter, filter_zero_variance
from cascade.config import FilterConfig

# random.Random(0).random() yields 0.844422, 0.757954, 0.420572, 0.258917, ... (Python's Mersenne Twister).


def test_filter_zero_variance() -> None:
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert filter_zero_variance(rewards).tolist() == [False, True, False]


def _filter(**overrides: object) -> PromptPassRateFilter:
    return PromptPassRateFilter(FilterConfig(prompt_filter=True, min_attempts=4, **overrides))  # type: ignore[arg-type]


def test_pass_rate_is_running_mean_and_needs_min_attempts() -> None:
    f = _filter(readmit_prob=0.0)
    f.update("a", [1.0, 1.0])
    assert f.pass_rate("a") == 1.0
    assert not f.is_filtered("a")  # 2 attempts < min_attempts 4: not trusted yet
    f.update("a", [1.0, 1.0])
    assert f.is_filtered("a")  # 4 attempts, mean 1.0 >= solved_threshold 1.0
    f.update("a", [0.0, 1.0, 1.0, 1.0])
    assert f.pass_rate("a") == pytest.approx(7 / 8)
    assert not f.is_filtered("a")
    f.update("z", [0.0] * 4)
    assert f.is_filtered("z")  # mean 0 <= unsolved_threshold 0
    assert f.pass_rate("never") is None and f.attempts("never") == 0


def test_thresholds_from_config() -> None:
    # solved_threshold 0.75: mean 0.75 counts as solved; unsolved 0.25: mean 0.25 counts as unsolved.
    f = _filter(readmit_prob=0.0, solved_threshold=0.75, unsolved_threshold=0.25)
    f.update("hi", [1, 1, 1, 0])
    f.update("lo", [1, 0, 0, 0])
    f.update("mid", [1, 1, 0, 0])
    assert [f.is_filtered(p) for p in ("hi", "lo", "mid")] == [True, True, False]


def test_readmission_with_seeded_rng() -> None:
    # readmit_prob 0.5 with draws 0.844422, 0.757954, 0.420572: filtered twice, readmitted on the third.
    f = _filter(readmit_prob=0.5)
    f.update("solved", [1.0] * 4)
    rng = random.Random(0)
    assert [f.is_active("solved", rng) for _ in range(3)] == [False, False, True]
    # An unfiltered prompt is active without consuming the rng: the next draw is still 0.258917.
    assert f.is_active("fresh", rng)
    assert rng.random() == pytest.approx(0.258917, abs=1e-6)


def test_filter_off_keeps_everything_active() -> None:
    f = PromptPassRateFilter(FilterConfig(prompt_filter=False, min_attempts=1, readmit_prob=0.0))
    f.update("a", [1.0])
    assert f.is_active("a", random.Random(0))


def test_sample_prefers_active_and_falls_back() -> None:
    f = _filter(readmit_prob=0.0)
    for pid in ("s1", "s2", "u1"):
        f.update(pid, [1.0 if pid.startswith("s") else 0.0] * 4)
    ids = ["s1", "a1", "s2", "a2", "u1", "a3"]
    picked = f.sample(ids, 3, random.Random(1))
    assert sorted(picked) == ["a1", "a2", "a3"]
    # Only 3 active: asking for 5 takes all active plus 2 of the filtered ones.
    picked = f.sample(ids, 5, random.Random(1))
    assert len(set(picked)) == 5 and {"a1", "a2", "a3"} <= set(picked)
    # Deterministic for a given rng seed, different for another.
    assert f.sample(ids, 5, random.Random(1)) == picked
    assert any(f.sample(ids, 2, random.Random(s)) != f.sample(ids, 2, random.Random(1)) for s in range(2, 6))
    with pytest.raises(ValueError):
        f.sample(ids, 7, random.Random(0))


def test_state_round_trips_through_json() -> None:
    f = _filter(readmit_prob=0.0)
    f.update("a", [1.0, 0.0, 0.5])
    f.update("b", [1.0] * 4)
    g = _filter(readmit_prob=0.0)
    g.load_state_dict(json.loads(json.dumps(f.state_dict())))
    assert g.state_dict() == f.state_dict()
    assert g.pass_rate("a") == pytest.approx(0.5) and g.attempts("a") == 3
    assert g.is_filtered("b")

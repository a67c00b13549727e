"""Schedules at start / middle / end / after, LR warm-up, token-budget growth."""

from __future__ import annotations

import pytest

from cascade.algo import schedule_value, token_budget, warmup_lr_factor
from cascade.config import ConstantSchedule, CosineSchedule, LinearSchedule, TokenBudget


def test_constant() -> None:
    sched = ConstantSchedule(value=0.7)
    assert [schedule_value(sched, s) for s in (0, 5, 10_000)] == [0.7, 0.7, 0.7]


def test_linear() -> None:
    # 1.0 -> 0.2 over 10 steps: step 5 is halfway, 1.0 - 0.8 * 0.5 = 0.6; held at 0.2 after.
    sched = LinearSchedule(start=1.0, end=0.2, steps=10)
    values = [schedule_value(sched, s) for s in (0, 5, 10, 15)]
    assert values == pytest.approx([1.0, 0.6, 0.2, 0.2])


def test_cosine_decay() -> None:
    # 1.0 -> 0.0 over 10 steps: v = 0.5 * (1 + cos(pi * s / 10)).
    # s=2: 0.5 * (1 + cos(0.2 pi)) = 0.5 * (1 + 0.809017) = 0.904508; s=5: 0.5; s=10 and after: 0.
    sched = CosineSchedule(start=1.0, end=0.0, steps=10)
    values = [schedule_value(sched, s) for s in (0, 2, 5, 10, 20)]
    assert values == pytest.approx([1.0, 0.904508, 0.5, 0.0, 0.0], abs=1e-6)


def test_cosine_rising() -> None:
    # 0.1 -> 0.5 over 4 steps, s=1: 0.5 + (0.1 - 0.5) * 0.5 * (1 + cos(pi/4))
    #   = 0.5 - 0.4 * 0.853553 = 0.158579
    sched = CosineSchedule(start=0.1, end=0.5, steps=4)
    assert schedule_value(sched, 1) == pytest.approx(0.158579, abs=1e-6)
    assert schedule_value(sched, 4) == pytest.approx(0.5)


def test_negative_step_is_refused() -> None:
    with pytest.raises(ValueError):
        schedule_value(ConstantSchedule(value=1.0), -1)


def test_warmup_lr_factor() -> None:
    # warmup 3: (step + 1) / 4 until it reaches 1.0 at step 3.
    assert [warmup_lr_factor(s, 3) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_lr_factor(0, 0) == 1.0
    assert warmup_lr_factor(0, 1) == 0.5


def test_token_budget_growth() -> None:
    # 24 for steps 0-4, 32 for 5-9, then 40 held (the paper's 24K -> 32K -> 40K, scaled down).
    budget = TokenBudget(max_new_tokens=24, grow_to=[32, 40], grow_every=5)
    assert [token_budget(budget, s) for s in (0, 4, 5, 9, 10, 100)] == [24, 24, 32, 32, 40, 40]
    assert token_budget(TokenBudget(max_new_tokens=24), 1000) == 24

"""Values that change over a stage: the distillation weight lambda(t), LR warm-up, token budget.

All take the *stage* step (0 at the start of each stage), so a resumed or re-ordered cascade
sees the same values at the same point of a stage.
"""

from __future__ import annotations

import math

from cascade.config import ConstantSchedule, CosineSchedule, LinearSchedule, TokenBudget


def _check_step(step: int) -> None:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")


def schedule_value(schedule: ConstantSchedule | LinearSchedule | CosineSchedule, step: int) -> float:
    """Value of `schedule` at stage step `step` (>= 0).

    constant: `value`. linear: `start + (end - start) * p`. cosine (half-cosine):
    `end + (start - end) * (1 + cos(pi * p)) / 2`, where `p = min(step / steps, 1)`;
    so `start` at step 0 and `end` from step `steps` on.
    """
    _check_step(step)
    if isinstance(schedule, ConstantSchedule):
        return float(schedule.value)
    progress = min(step / schedule.steps, 1.0)
    if isinstance(schedule, LinearSchedule):
        return schedule.start + (schedule.end - schedule.start) * progress
    if isinstance(schedule, CosineSchedule):
        return schedule.end + (schedule.start - schedule.end) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise TypeError(f"unknown schedule type {type(schedule).__name__}")


def warmup_lr_factor(step: int, warmup_steps: int) -> float:
    """Learning-rate multiplier for linear warm-up: `min(1, (step + 1) / (warmup_steps + 1))`.

    Step 0 trains at `1 / (warmup_steps + 1)` of the LR (never 0: a step with LR 0 would waste
    a rollout batch), rising by that amount each step, and steps `>= warmup_steps` get 1.0.
    E.g. warmup_steps=3: 0.25, 0.5, 0.75, 1.0, 1.0, ... `warmup_steps=0` means always 1.0.
    """
    _check_step(step)
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    return min(1.0, (step + 1) / (warmup_steps + 1))


def token_budget(budget: TokenBudget, step: int) -> int:
    """Max new tokens at stage step `step`.

    `max_new_tokens` for steps `[0, grow_every)`, `grow_to[0]` for `[grow_every, 2 * grow_every)`,
    and so on; the last value is held.
    """
    _check_step(step)
    if not budget.grow_to or budget.grow_every is None:
        return budget.max_new_tokens
    values = [budget.max_new_tokens, *budget.grow_to]
    return values[min(step // budget.grow_every, len(values) - 1)]

"""Stage advance (threshold held for `patience` evals) and best-checkpoint teacher tracking."""

from __future__ import annotations

import json

import pytest

from cascade.config import AdvanceRule
from cascade.runner.curriculum import AdvanceTracker, TeacherEntry, TeacherRegistry


def test_patience_resets_on_a_dip() -> None:
    tracker = AdvanceTracker(AdvanceRule(threshold=0.5, patience=2, max_steps=100))
    assert tracker.observe(10, 0.6) is False  # streak 1
    assert tracker.observe(20, 0.4) is False  # dip: streak 0
    assert tracker.observe(30, 0.5) is False  # at threshold counts: streak 1
    assert tracker.observe(40, 0.7) is True  # streak 2 = patience


def test_min_steps_delays_and_max_steps() -> None:
    tracker = AdvanceTracker(AdvanceRule(threshold=0.5, patience=1, min_steps=25, max_steps=50))
    assert tracker.observe(10, 0.9) is False  # streak 1 but step 10 < min_steps 25
    assert tracker.observe(30, 0.9) is True
    assert not tracker.reached_max(49)
    assert tracker.reached_max(50)


def test_repeat_eval_at_same_step_is_not_counted_twice() -> None:
    tracker = AdvanceTracker(AdvanceRule(threshold=0.5, patience=2))
    assert tracker.observe(10, 0.9) is False
    assert tracker.observe(10, 0.9) is False  # same step: still streak 1
    with pytest.raises(ValueError):
        tracker.observe(5, 0.9)


def test_tracker_state_round_trips_through_json() -> None:
    rule = AdvanceRule(threshold=0.5, patience=3)
    tracker = AdvanceTracker(rule)
    tracker.observe(10, 0.6)
    tracker.observe(20, 0.7)
    restored = AdvanceTracker(rule)
    restored.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    assert restored.history == [(10, 0.6), (20, 0.7)]
    assert restored.observe(30, 0.8) is True  # streak carried over: 3


def test_registry_keeps_the_best_not_the_last() -> None:
    reg = TeacherRegistry()
    assert reg.teacher("math") is None
    assert reg.offer("math", 0.5, 10, "ckpt/10") is True
    assert reg.offer("math", 0.7, 20, "ckpt/20") is True
    assert reg.offer("math", 0.6, 30, "ckpt/30") is False
    assert reg.offer("math", 0.7, 40, "ckpt/40") is False  # tie keeps the earlier
    assert reg.offer("math", float("nan"), 50, "ckpt/50") is False
    assert reg.teacher("math") == TeacherEntry(path="ckpt/20", score=0.7, step=20)
    assert reg.offer("code", 0.1, 60, "ckpt/60") is True
    assert reg.domains() == ["math", "code"]


def test_registry_state_round_trips_through_json() -> None:
    reg = TeacherRegistry()
    reg.offer("math", 0.7, 20, "ckpt/20")
    reg.offer("if", 0.3, 5, "ckpt/5")
    restored = TeacherRegistry()
    restored.load_state_dict(json.loads(json.dumps(reg.state_dict())))
    assert restored.teacher("math") == TeacherEntry(path="ckpt/20", score=0.7, step=20)
    assert restored.teacher("if") == TeacherEntry(path="ckpt/5", score=0.3, step=5)
    assert restored.offer("math", 0.65, 30, "ckpt/30") is False

"""The runner's resumable state that is not a tensor: saved as JSON inside each checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunState:
    """Everything besides weights/optimizer/RNG tensors needed to resume (JSON)."""

    stage_index: int = 0
    stage_step: int = 0
    global_step: int = 0
    policy_version: int = 0
    batches_made: int = 0
    """RL batches generated so far: with per-request seeding, part of each request's seed."""
    stage_started: bool = False
    tracker: dict[str, Any] = field(default_factory=dict)
    teachers: dict[str, Any] = field(default_factory=dict)
    filters: dict[str, Any] = field(default_factory=dict)
    py_rng: Any = None
    last_eval_global_step: int = -1
    gate_phase: dict[str, Any] = field(default_factory=dict)
    """The regression gate's phase under way: `{"domains": [...], "steps": n, "opened_at": g}`."""
    finished: bool = False
    store_ids: dict[str, Any] = field(default_factory=dict)


def rng_state_to_json(state: tuple) -> list:
    """`random.Random.getstate()` as JSON (tuples become lists)."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def rng_state_from_json(saved: list) -> tuple:
    version, internal, gauss = saved
    return (version, tuple(internal), gauss)


class RunDirError(Exception):
    """The run directory holds another run (neither resume nor fresh was asked for)."""


@dataclass
class RunResult:
    run_dir: Path
    report_dir: Path
    finished: bool
    stopped_by: str

"""The API's response bodies: what the OpenAPI document promises and schemathesis checks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class ErrorOut(BaseModel):
    detail: str


class ConfigErrorOut(BaseModel):
    detail: str
    """One line naming the field, as `cascade validate` prints it."""
    field: str | None = None


class ConflictOut(BaseModel):
    detail: str
    current_state: str
    """The stage's (or cascade's) state when the move was refused."""
    requested_state: str


class ActionOut(BaseModel):
    """An operator command offered now: the request is refused neither by the state machine nor a
    no-op repeat. Send `POST path` with a write token."""

    command: str
    """`pause`, `resume`, `advance` (a stage) or `abort` (a cascade)."""
    leads_to: str
    """The state it asks for, applied by the runner at its next step boundary."""
    path: str


class StageOut(BaseModel):
    id: int
    cascade_id: int
    index: int
    name: str
    domain: str
    state: str
    desired_state: str | None
    """An operator's request the runner has not applied yet (e.g. `paused`)."""
    steps_done: int
    max_steps: int | None
    started_at: datetime | None
    ended_at: datetime | None
    actions: list[ActionOut] = []
    """The commands this stage offers in its current state (see `ActionOut`)."""


class DependencyOutages(BaseModel):
    outages: int = 0
    down_s: float = 0.0
    last_cause: str | None = None
    last_at: datetime | None = None
    """When the last one was recorded (at the first step after it ended)."""


class RunOut(BaseModel):
    id: int
    kind: str
    seed: int
    distill: bool
    status: str
    """`running`, `completed`, `failed`, `aborted`, or `stalled`: running in the store, a stage
    running, and no live runner (its lease expired or was never taken back)."""
    started_at: datetime
    ended_at: datetime | None
    output_dir: str
    holder: str | None = None
    """The live runner's `host pid N (since ...)`, if one holds the cascade for this run."""
    heartbeat_at: datetime | None = None
    """The last heartbeat of the runner that held (or holds) this run's lease."""
    heartbeat_age_s: float | None = None
    """Seconds since that heartbeat, while a live runner holds the run."""
    degraded: dict[str, str] = {}
    """While a live runner rides out an outage: dependency (`redis`, `teacher`, `rollout`, or
    `heartbeat` when the runner has gone silent, e.g. it cannot reach the database) -> what is
    known. Empty when all is well (`services.api.run_health`)."""
    outages: dict[str, DependencyOutages] = {}
    """The outages this run rode out, by dependency (`database`, `redis`, `teacher`, `rollout`)."""


class CascadeSummary(BaseModel):
    id: int
    name: str
    status: str
    created_at: datetime
    stages: int
    active_stage: str | None
    """The running or paused stage's name, if any."""


class CascadeOut(BaseModel):
    id: int
    name: str
    status: str
    created_at: datetime
    config: dict[str, Any]
    stages: list[StageOut]
    runs: list[RunOut]
    actions: list[ActionOut] = []
    """The cascade's commands offered now (`abort` unless it finished or nothing is left to abort)."""


class CommandOut(BaseModel):
    stage: StageOut
    changed: bool
    """False when the command was already in effect (repeated requests are no-ops)."""


class AbortOut(BaseModel):
    cascade: CascadeSummary
    changed: bool


class StepOut(BaseModel):
    stage_index: int
    step: int
    global_step: int
    metrics: dict[str, Any]


class MetricsOut(BaseModel):
    run_id: int | None
    steps: list[StepOut]


class MetricOut(BaseModel):
    """One eval metric (greedy, avg@k, pass@k) with its confidence interval."""

    value: float | None
    low: float | None
    high: float | None
    n: int | None = None
    method: str | None = None
    """"wilson" (0/1 outcome per prompt) or "bootstrap" (over prompts)."""


class EvalOut(BaseModel):
    stage_index: int
    step: int
    global_step: int
    domain: str
    score: float
    """The primary metric (the first of the stage's `eval.metrics`)."""
    n: int
    reasons: dict[str, int]
    low: float | None = None
    high: float | None = None
    """Confidence interval of `score` (None on evals recorded before intervals existed)."""
    metrics: dict[str, MetricOut] = {}


class EvalsOut(BaseModel):
    run_id: int | None
    evals: list[EvalOut]


class CheckpointOut(BaseModel):
    id: int
    run_id: int
    stage_id: int
    step: int
    global_step: int
    path: str
    kind: str
    domain: str | None
    score: float | None
    is_teacher: bool
    created_at: datetime


class RegressionRowOut(BaseModel):
    domain: str
    start: float | None
    after: dict[str, float | None]
    """Stage name -> the domain's last eval in that stage."""
    best: float | None
    best_global_step: int | None
    final: float | None
    final_minus_best: float | None
    start_ci: list[float] | None = None
    """[low, high] confidence interval of `start` (likewise below; None when not recorded)."""
    after_ci: dict[str, list[float] | None] = {}
    best_ci: list[float] | None = None
    final_ci: list[float] | None = None
    drop_outside_noise: bool | None = None
    """True when final's interval lies wholly below best's (non-overlapping intervals)."""


class RegressionOut(BaseModel):
    run_id: int | None
    units: str = "fraction"
    metric: str | None = None
    """The metric tabulated (None: each eval's primary score)."""
    noise_rule: str = ""
    stages: list[str]
    rows: list[RegressionRowOut]


class ReasonsOut(BaseModel):
    run_id: int | None
    training: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Stage name -> verdict reason -> count, over the stage's training rollouts."""
    eval: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Domain -> reason -> count at the domain's latest eval."""


class CompletionOut(BaseModel):
    """One completion a training step logged (`completions.jsonl`): each step keeps the best and
    the worst completion of its first groups, their text cut to a few thousand characters."""

    global_step: int | None = None
    stage: str | None = None
    domain: str | None = None
    problem: str | None = None
    """The problem's id in its domain's data."""
    prompt: str = ""
    completion: str = ""
    reward: float | None = None
    reason: str | None = None
    """The verifier's verdict reason (`ok`, `wrong_answer`, ...)."""
    detail: str | None = None
    finish: str | None = None
    """Why generation stopped (`stop`, `length`, ...)."""
    tokens: int | None = None


class CompletionsOut(BaseModel):
    run_id: int | None
    completions: list[CompletionOut] = Field(default_factory=list)
    """Oldest first."""
    note: str | None = None
    """Why there are none to show: no log yet, or the run's directory is not one the API reads."""


class EventOut(BaseModel):
    id: int
    stage_id: int | None
    at: datetime
    kind: str
    from_state: str | None
    to_state: str | None
    actor: str
    detail: dict[str, Any]


class WhoAmIOut(BaseModel):
    name: str
    """The token's name in the API's settings (events record `api:<name>`)."""
    role: str
    can_write: bool
    """Whether this token may create cascades and steer stages."""


class HealthOut(BaseModel):
    status: str
    database: str
    schema_revision: str | None


class ConfigOut(BaseModel):
    cascade_id: int
    config: dict[str, Any]
    """The whole validated config as stored (`CascadeConfig.model_dump(mode="json")`)."""
    config_hash: str | None
    """sha256 of its training settings (what a joining runner's config must match)."""


class DeletedOut(BaseModel):
    cascade_id: int
    deleted: dict[str, int]
    """Rows deleted per table (cascades, stages, runs, steps, evals, checkpoints, events, leases)."""

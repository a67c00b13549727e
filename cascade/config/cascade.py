"""The whole cascade (`CascadeConfig`): its sections, the checks across them, and the
command-line overrides of a loaded one (`--device`, `--track`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from cascade.config.base import StrictModel
from cascade.config.domains import DomainConfig, SyntheticPrompts
from cascade.config.evaluation import parse_watched_metric
from cascade.config.run import (
    ChatConfig,
    CheckpointConfig,
    LearnerConfig,
    LeaseConfig,
    ModelConfig,
    ResilienceConfig,
    RolloutConfig,
)
from cascade.config.stage import StageConfig
from cascade.config.tracking import BackendName, TrackingConfig

DIRECTORY_NAMES = (".", "..")
"""Names the pattern admits that name a directory instead of one in `output_dir`."""


class CascadeConfig(StrictModel):
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Also the run directory's name (`<output_dir>/<name>`): letters, digits, `_`, `.`, `-`,
    and never `.` or `..` (they would name `output_dir` itself or its parent)."""
    seed: int = 0
    model: ModelConfig
    chat: ChatConfig = ChatConfig()
    domains: list[DomainConfig] = Field(..., min_length=1)
    """Every domain evaluated throughout the cascade (the regression table's rows)."""
    stages: list[StageConfig] = Field(..., min_length=1)
    checkpoint: CheckpointConfig = CheckpointConfig()
    rollout: RolloutConfig = RolloutConfig()
    lease: LeaseConfig = LeaseConfig()
    learner: LearnerConfig = LearnerConfig()
    resilience: ResilienceConfig = ResilienceConfig()
    tracking: TrackingConfig = TrackingConfig()
    """Experiment trackers (TensorBoard, MLflow, W&B): none by default."""
    output_dir: Path = Path("runs")

    @field_validator("name")
    @classmethod
    def _not_a_directory(cls, value: str) -> str:
        if value in DIRECTORY_NAMES:
            raise ValueError(
                f"{value!r} names a directory, not a run in it (the run directory is <output_dir>/<name>)"
            )
        return value

    @model_validator(mode="after")
    def _check_domains(self) -> CascadeConfig:
        names = [d.name for d in self.domains]
        if len(set(names)) != len(names):
            raise ValueError(f"domains listed twice: {names}")
        for i, d in enumerate(self.domains):
            if d.kind == "python" and isinstance(d.prompts, SyntheticPrompts):
                raise ValueError(
                    f"domains.{i}.prompts: domain {d.name!r} (python) has no problems of its own: "
                    "give them as kind jsonl or hf"
                )
        for i, stage in enumerate(self.stages):
            if stage.domain not in names:
                raise ValueError(f"stages.{i}.domain {stage.domain!r} is not in domains {names}")
            earlier = {d for s in self.stages[:i] for d in s.mix}
            for name in stage.domains:
                if name not in names:
                    raise ValueError(f"stages.{i}.domains: {name!r} is not in domains {names}")
                if stage.kind == "mopd" and name not in earlier:
                    raise ValueError(
                        f"stages.{i}.domains: {name!r} is not trained in an earlier stage (an mopd "
                        "stage distills each domain from its best checkpoint)"
                    )
            guarded = stage.gate.domains
            for name in guarded if isinstance(guarded, list) else ():
                if name not in earlier:
                    raise ValueError(f"stages.{i}.gate.domains: {name!r} is not trained in an earlier stage")
            teachers = stage.distill.teachers
            if isinstance(teachers, list):
                for t in teachers:
                    if t not in earlier:
                        raise ValueError(
                            f"stages.{i}.distill.teachers: {t!r} is not trained in an earlier stage"
                        )
            domain, metric = parse_watched_metric(stage.advance.metric)
            if domain != "{domain}" and domain not in names:
                raise ValueError(f"stages.{i}.advance.metric: domain {domain!r} is not in domains {names}")
            if metric is not None and metric not in stage.eval.metrics:
                raise ValueError(
                    f"stages.{i}.advance.metric: {metric!r} is not in stages.{i}.eval.metrics "
                    f"{stage.eval.metrics}"
                )
            if stage.eval.primary != self.stages[0].eval.primary:
                raise ValueError(
                    f"stages.{i}.eval.metrics starts with {stage.eval.primary!r} but stage 0's with "
                    f"{self.stages[0].eval.primary!r}: the primary (first) eval metric is compared "
                    "across stages (regression table, teacher selection), so all stages share it"
                )
        labels = [s.label for s in self.stages]
        if len(set(labels)) != len(labels):
            raise ValueError(f"stage names must be unique (set `name`): {labels}")
        return self

    def domain(self, name: str) -> DomainConfig:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(name)

    def guarded_by_gate(self, stage_index: int) -> list[str]:
        """The earlier domains the stage's regression gate watches (none when it is off)."""
        return self.gate_domains(stage_index) if self.stages[stage_index].gate.enabled else []

    def gate_domains(self, stage_index: int) -> list[str]:
        """The earlier domains named by the stage's `gate.domains` (the drift warning's too)."""
        stage = self.stages[stage_index]
        if isinstance(stage.gate.domains, list):
            return list(stage.gate.domains)
        earlier: list[str] = []
        for s in self.stages[:stage_index]:
            earlier += [d for d in s.mix if d not in earlier and d not in stage.mix]
        return earlier

    def teachers_for(self, stage_index: int) -> list[str]:
        """Teacher domains for a stage: earlier stages' domains, without its own (an mopd
        stage's teachers are its domains, each its own domain's best checkpoint)."""
        stage = self.stages[stage_index]
        if not stage.distill.enabled:
            return []
        if stage.kind == "mopd":
            return list(stage.mix)
        own = stage.mix
        if stage.distill.teachers == "earlier":
            seen: list[str] = []
            for s in self.stages[:stage_index]:
                for d in s.mix:
                    if d not in own and d not in seen:
                        seen.append(d)
            return seen
        return [t for t in stage.distill.teachers if t not in own]


def with_learner_device(cfg: CascadeConfig, device: str | None) -> CascadeConfig:
    """`cfg` with `learner.device` replaced (a `--device` flag); None leaves it as it is."""
    if device is None:
        return cfg
    learner = cfg.learner.model_copy(update={"device": LearnerConfig(device=device).device})
    return cfg.model_copy(update={"learner": learner})


def with_tracking(cfg: CascadeConfig, backends: list[BackendName] | None) -> CascadeConfig:
    """`cfg` with `tracking.backends` replaced (a `--track` flag); None leaves it as it is."""
    if backends is None:
        return cfg
    tracking = cfg.tracking.model_copy(update={"backends": list(backends)})
    return cfg.model_copy(update={"tracking": tracking})

"""A stage's section (`stages:`): GRPO, the prompt filters, distillation from earlier stages' teachers,
and the eval and advance rule (`cascade.config.evaluation`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cascade.config.base import DomainName, StrictModel
from cascade.config.evaluation import AdvanceRule, EvalConfig
from cascade.config.schedules import ConstantSchedule, Schedule, TokenBudget


class GrpoConfig(StrictModel):
    group_size: int = Field(8, ge=2)
    """Completions per prompt; advantages are normalised within each group."""
    prompts_per_step: int = Field(16, ge=1)
    learning_rate: float = Field(1e-4, gt=0, le=1.0)
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up at the start of the stage."""
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1.0)
    budget: TokenBudget = TokenBudget(max_new_tokens=32)
    loss_aggregation: Literal["token", "sequence"] = "token"
    """`token`: sum over the group's tokens / total tokens; `sequence`: mean of sequence means."""
    clip_eps_low: float = Field(0.2, ge=0, lt=1)
    clip_eps_high: float = Field(0.28, ge=0)
    max_staleness: int = Field(0, ge=0)
    """Policy versions a rollout may lag the learner; 0 = strictly on-policy."""
    kl_coef: float = Field(0.0, ge=0)
    """k3 KL penalty to the frozen stage-start policy; 0 disables it."""
    overlong: Literal["mask", "zero"] = "mask"
    """Completions cut by the token budget: drop from the loss (`mask`) or score 0 (`zero`)."""
    thinking: bool = False
    """Render prompts with the think flag instead of the no-think flag."""
    max_verifier_failure_fraction: float = Field(0.5, ge=0, le=1)
    """Largest share of a step's samples whose verifier failed (`infra_error`) that the step
    trains on. Such samples never count (advantage 0, out of their group's statistics), but a
    step past this bound learns from a biased remnant: it raises `VerifierFailureError` and the
    stage fails with the main causes. 1 never stops; 0 stops at the first failure."""


class FilterConfig(StrictModel):
    drop_zero_variance: bool = True
    """Drop groups whose rewards are all equal (their advantages are all 0)."""
    prompt_filter: bool = False
    """Epoch-level: stop sampling prompts that were always or never solved."""
    solved_threshold: float = Field(1.0, gt=0, le=1)
    unsolved_threshold: float = Field(0.0, ge=0, lt=1)
    readmit_prob: float = Field(0.05, ge=0, le=1)
    """Chance a filtered prompt is sampled again anyway (pass rates drift)."""
    min_attempts: int = Field(8, ge=1)
    """Samples seen before a prompt's pass rate is trusted."""


class DistillConfig(StrictModel):
    enabled: bool = True
    teachers: list[DomainName] | Literal["earlier"] = "earlier"
    """Teacher domains: explicit, or every domain trained in an earlier stage."""
    loss: Literal["full", "topk", "sampled"] = "sampled"
    topk: int = Field(16, ge=1)
    lam: Schedule = ConstantSchedule(value=1.0)
    """Weight of the distillation term; scheduled over stage steps."""
    temperature: float = Field(1.0, gt=0)
    prompt_source: Literal["replay", "current"] = "replay"
    """`replay`: prompts from the teacher's own domain; `current`: this stage's prompts."""
    prompts_per_teacher: int = Field(16, ge=1)
    samples_per_prompt: int = Field(1, ge=1)
    teacher_weights: dict[str, float] = Field(default_factory=dict)
    """Per-teacher weight w_d (default 1.0)."""


class StageConfig(StrictModel):
    name: str | None = None
    domain: DomainName
    grpo: GrpoConfig = GrpoConfig()
    filter: FilterConfig = FilterConfig()
    distill: DistillConfig = DistillConfig()
    advance: AdvanceRule = AdvanceRule()
    eval: EvalConfig = EvalConfig()

    @property
    def label(self) -> str:
        return self.name or self.domain

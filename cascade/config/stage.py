"""A stage's section (`stages:`): GRPO, the prompt filters, distillation from earlier stages' teachers,
and the eval and advance rule (`cascade.config.evaluation`)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from cascade.config.base import DomainName, StrictModel
from cascade.config.evaluation import AdvanceRule, EvalConfig
from cascade.config.schedules import ConstantSchedule, Schedule, TokenBudget


class BehaviourCorrection(StrictModel):
    """Correcting the GRPO term for the rollout engine's log-probs not being the learner's
    (docs/algorithm.md, "Behaviour-policy correction"). Each counted token gets a weight from
    `ratio = pi_learner / pi_engine`; the PPO ratio is then taken against the learner's own
    log-probs. The mismatch metrics (`grpo_mismatch_*`) are logged whatever the mode."""

    mode: Literal["off", "tis", "masked", "seq_mask"] = "off"
    """`off`: no correction (the engine's log-probs are the ratio's old policy when stale, as
    always); `tis`: truncated importance sampling, weight `min(ratio, high)`; `masked` (IcePop):
    weight `ratio` inside `[low, high]`, tokens outside dropped; `seq_mask`: sequences whose
    summed log-ratio exceeds `seq_threshold` in size dropped whole, the rest `min(ratio, high)`."""
    low: float = Field(0.5, gt=0, le=1)
    """Lower ratio bound: `masked` drops tokens below it; every mode counts the tokens outside
    `[low, high]` (`grpo_mismatch_out_frac`)."""
    high: float = Field(2.0, ge=1)
    """Upper ratio bound: `tis` and `seq_mask` truncate the weight at it, `masked` drops tokens
    above it."""
    seq_threshold: float = Field(2.0, gt=0)
    """`seq_mask`: the largest `|sum over a sequence's counted tokens of (log p_learner -
    log p_engine)|` a sequence may have and stay in the loss."""


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
    behaviour_correction: BehaviourCorrection = BehaviourCorrection()
    """Weighting each token by how the learner's log-prob compares with the rollout engine's
    (`mode: off`, the default, leaves the loss as it is and only logs the mismatch)."""


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


class RegressionGate(StrictModel):
    """The loop closed: when an earlier domain has fallen below its best checkpoint by more than
    the eval's noise, the stage does not advance; an MOPD phase distils the fallen domains from
    their best checkpoints until they recover (or `max_steps`), then the cascade goes on."""

    enabled: bool = False
    check: Literal["stage_end", "every_eval"] = "stage_end"
    """When to test: at the stage's end only, or at every eval of the stage."""
    domains: list[DomainName] | Literal["earlier"] = "earlier"
    """The domains guarded: every domain trained in an earlier stage, or a list of them."""
    max_steps: int = Field(20, ge=1)
    """The bound on one inserted phase's steps (it ends sooner when every fallen domain is back)."""
    eval_every: int = Field(5, ge=1)
    """Phase steps between the evals that decide whether the fallen domains are back."""
    drift_every: int = Field(0, ge=0)
    """The cheap early warning: every `drift_every` stage steps, the KL between the policy and
    the stage-start policy on a fixed set of earlier domains' prompts (`drift_kl/<domain>`);
    0 = off."""
    drift_prompts: int = Field(4, ge=1)
    """Prompts per earlier domain in that fixed set."""


StageKind = Literal["rl", "mopd"]
MOPD_NEEDS_DOMAINS = "kind mopd: list the domains distilled (domains: {<domain>: <share>, ...})"


class StageConfig(StrictModel):
    """One stage of the cascade.

    `kind: rl` (the default) trains by GRPO on one domain (`domain`) or on several at once
    (`domains`, each with its share of a step's prompts: a multi-domain RL stage), with
    distillation from earlier stages' teachers as `distill` says. `kind: mopd` is multi-domain
    on-policy distillation alone (Nemotron-Cascade 2): no outcome reward; a step's prompts are
    drawn from `domains` by their shares and each sample is distilled from its own domain's best
    checkpoint (`distill.loss`, `distill.samples_per_prompt` rollouts per prompt)."""

    name: str | None = None
    kind: StageKind = "rl"
    domain: DomainName
    """The stage's domain; with `domains`, the first of them (the `{domain}` of `advance.metric`)."""
    domains: dict[DomainName, float] = Field(default_factory=dict)
    """Several domains trained in one step, each with its share of `grpo.prompts_per_step`
    (shares are relative: `{math: 2, code: 1}` is two thirds math). A group never mixes domains:
    each prompt's group is scored by its own verifier and normalised on its own."""
    grpo: GrpoConfig = GrpoConfig()
    filter: FilterConfig = FilterConfig()
    distill: DistillConfig = DistillConfig()
    advance: AdvanceRule = AdvanceRule()
    eval: EvalConfig = EvalConfig()
    gate: RegressionGate = RegressionGate()

    @model_validator(mode="before")
    @classmethod
    def _domain_from_mix(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "mopd" and not data.get("domains"):
            raise ValueError(MOPD_NEEDS_DOMAINS)
        if isinstance(data, dict) and isinstance(data.get("domains"), dict) and data["domains"]:
            first = next(iter(data["domains"]))
            if data.get("domain") is None:
                data = {**data, "domain": first}
            elif data["domain"] != first:
                raise ValueError(
                    f"domain {data['domain']!r} with domains {list(data['domains'])}: give one of "
                    "them (a stage with domains has the first of them as its domain)"
                )
        return data

    @model_validator(mode="after")
    def _check_mix(self) -> StageConfig:
        for name, share in self.domains.items():
            if not (share > 0 and math.isfinite(share)):
                raise ValueError(f"domains.{name}: a share must be a finite number > 0, got {share}")
        if self.kind == "mopd" and not self.domains:
            raise ValueError(MOPD_NEEDS_DOMAINS)
        if self.kind == "mopd" and not self.distill.enabled:
            raise ValueError("kind mopd: distillation is the whole stage (distill.enabled must be true)")
        if len(self.domain_label) > 64:
            raise ValueError(f"domains: {self.domain_label!r} is longer than the store's 64 characters")
        return self

    @property
    def label(self) -> str:
        return self.name or self.domain_label

    @property
    def mix(self) -> dict[str, float]:
        """Each domain of the stage with its share of a step's prompts (shares sum to 1)."""
        if not self.domains:
            return {self.domain: 1.0}
        total = sum(self.domains.values())
        return {d: s / total for d, s in self.domains.items()}

    @property
    def domain_label(self) -> str:
        """The stage's domain as the store and the report show it (`math+code` for a mix)."""
        return "+".join(self.mix)

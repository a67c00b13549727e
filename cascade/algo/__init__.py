"""Pure-math core of the learner: advantages, losses, distillation, schedules, filters.

Everything here is a pure function of tensors/configs (or a small object with JSON state), so
the embedded runner and the distributed learner compute exactly the same thing.
"""

from cascade.algo.advantages import group_advantages, zero_variance_mask
from cascade.algo.behaviour import BehaviourSettings, BehaviourWeights, behaviour_weights
from cascade.algo.distill import (
    DistillLossOutput,
    FullDistillInput,
    SampledDistillInput,
    TopkDistillInput,
    full_distill_loss,
    full_token_kl,
    sampled_distill_loss,
    token_kl_loss,
    topk_distill_loss,
    topk_token_kl,
)
from cascade.algo.filters import PromptPassRateFilter, filter_zero_variance
from cascade.algo.grpo import GrpoLossInput, GrpoLossOutput, GrpoNorms, grpo_loss, grpo_normalisers, k3_kl
from cascade.algo.schedules import schedule_value, token_budget, warmup_lr_factor

__all__ = [
    "BehaviourSettings",
    "BehaviourWeights",
    "behaviour_weights",
    "DistillLossOutput",
    "FullDistillInput",
    "GrpoLossInput",
    "GrpoNorms",
    "grpo_normalisers",
    "GrpoLossOutput",
    "PromptPassRateFilter",
    "SampledDistillInput",
    "TopkDistillInput",
    "filter_zero_variance",
    "full_distill_loss",
    "full_token_kl",
    "token_kl_loss",
    "topk_token_kl",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "sampled_distill_loss",
    "schedule_value",
    "token_budget",
    "topk_distill_loss",
    "warmup_lr_factor",
    "zero_variance_mask",
]

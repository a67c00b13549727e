"""One step's distillation terms: the student's own completions on each teacher's prompts,
scored against that teacher (on-policy distillation). The embedded runner calls it with teacher
models in this process; the distributed learner gets the same numbers from the teacher service."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel

from cascade.config import ChatConfig, StageConfig
from cascade.domains.base import Problem
from cascade.model.loading import Policy
from cascade.rollout import sample_completions
from cascade.trainer import DistillSamples, LossTerm, distill_term


def local_distill_terms(
    policy: Policy,
    chat: ChatConfig,
    stage: StageConfig,
    teachers: Sequence[str],
    *,
    budget: int,
    problems_for: Callable[[str], list[Problem]],
    teacher_model: Callable[[str], PreTrainedModel],
    generator_for: Callable[[str], torch.Generator],
) -> tuple[list[tuple[float, LossTerm]], dict[str, float]]:
    """(weight, term) per teacher and the terms' metrics, for `stage.distill` with `budget` tokens."""
    dc = stage.distill
    g = stage.grpo
    terms: list[tuple[float, LossTerm]] = []
    metrics: dict[str, float] = {}
    for d in teachers:
        prompt_ids, gen = sample_completions(
            policy,
            chat,
            problems_for(d),
            n=dc.samples_per_prompt,
            max_new_tokens=budget,
            temperature=g.temperature,
            top_p=g.top_p,
            thinking=g.thinking,
            generator=generator_for(d),
        )
        samples = DistillSamples(
            teacher=d,
            prompt_ids=prompt_ids,
            completion_ids=gen.completion_ids,
            rollout_logprobs=gen.logprobs,
            temperature=g.temperature,
        )
        term = distill_term(policy.model, teacher_model(d), samples, dc, pad_id=policy.pad_token_id)
        terms.append((dc.teacher_weights.get(d, 1.0), term))
        metrics.update(term.metrics)
    return terms, metrics

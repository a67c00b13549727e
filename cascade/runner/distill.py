"""One step's on-policy distillation: the student's own completions on each teacher's prompts
(from the rollout source), the teacher's view of them (from the teacher source), then the loss
against the student being trained. The fetch can run in a thread while the RL batch is out; the
loss always runs in the loop, on the model that is about to be updated."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedModel

from cascade.algo.masking import SumOverRanks
from cascade.config import StageConfig
from cascade.engine.base import SamplingSettings
from cascade.engine.batch import SequenceBatch, build_batch
from cascade.runner.sources import RolloutSource, TeacherSource
from cascade.trainer import DistillSamples, LossTerm, TeacherTokens, distill_loss_term, placeholder_batch


@dataclass
class DistillJob:
    teacher: str
    prompt_ids: list[list[int]]  # one per replay prompt
    seed: int | None


@dataclass
class DistillData:
    samples: DistillSamples
    batch: SequenceBatch
    tokens: TeacherTokens


def fetch_distill(
    jobs: list[DistillJob],
    *,
    stage: StageConfig,
    budget: int,
    pad_id: int,
    rollouts: RolloutSource,
    teachers: TeacherSource,
) -> list[DistillData]:
    dc, g = stage.distill, stage.grpo
    n = dc.samples_per_prompt
    out = []
    for job in jobs:
        sampling = SamplingSettings(
            max_tokens=budget, temperature=g.temperature, top_p=g.top_p, seed=job.seed
        )
        gen = rollouts.generate(job.prompt_ids, n, sampling).generation
        repeated = [ids for ids in job.prompt_ids for _ in range(n)]
        samples = DistillSamples(job.teacher, repeated, gen.completion_ids, gen.logprobs, g.temperature)
        sb = build_batch(repeated, gen.completion_ids, pad_id)
        out.append(DistillData(samples, sb, teachers.tokens(job.teacher, samples, sb, dc)))
    return out


def share_distill(data: DistillData, rank: int, size: int, pad_id: int) -> DistillData:
    """Rank `rank`'s contiguous block of the student's sequences, on its own batch layout; a
    placeholder row with nothing counted when the block is empty (the rank still runs the
    forward pass the sharded model needs)."""
    n = len(data.samples.prompt_ids)
    lo, hi = n * rank // size, n * (rank + 1) // size
    s = data.samples
    if lo == hi:
        samples = DistillSamples(s.teacher, [[pad_id]], [[pad_id]], [[0.0]], s.temperature)
        sb = placeholder_batch(pad_id)
        return DistillData(samples, sb, data.tokens.rows(0, 1, 1))
    samples = DistillSamples(
        s.teacher,
        s.prompt_ids[lo:hi],
        s.completion_ids[lo:hi],
        s.rollout_logprobs[lo:hi],
        s.temperature,
    )
    sb = build_batch(samples.prompt_ids, samples.completion_ids, pad_id)
    return DistillData(samples, sb, data.tokens.rows(lo, hi, sb.completion_ids.shape[1]))


def distill_terms(
    model: PreTrainedModel,
    fetched: list[DistillData],
    stage: StageConfig,
    reduce: SumOverRanks | None = None,
) -> tuple[list[tuple[float, LossTerm]], dict[str, float]]:
    """(weight, term) per teacher and the terms' metrics (`reduce`: see `SumOverRanks`)."""
    dc = stage.distill
    terms: list[tuple[float, LossTerm]] = []
    metrics: dict[str, float] = {}
    for f in fetched:
        term = distill_loss_term(model, f.batch, f.tokens, f.samples, dc, reduce)
        terms.append((dc.teacher_weights.get(f.samples.teacher, 1.0), term))
        metrics.update(term.metrics)
    return terms, metrics

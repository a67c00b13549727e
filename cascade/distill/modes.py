"""The distillation loss modes (`distill.loss`): one object per mode, and the registry of them.

A mode is how much of the teacher's distribution a distillation step uses, and it decides every
place that distribution goes through:

- on the wire: its `proto_enum` (`proto/cascade/v1/teacher.proto`, `LogprobMode`);
- the learner's question to the teacher service (`requests`: mode, temperature, k, and any
  further pass a metric needs);
- the teacher's tokens on the learner's batch layout, from a teacher model in this process
  (`local_tokens`) or from the service's replies (`remote_tokens`);
- the teacher side (`cascade.distill.scoring`): what it computes for one sequence (`score`), what
  it checks in a request (`check_request`), what its reply says (`reply_topk`, `reply_size_error`);
- the loss (`loss`): which function of `cascade.algo.distill` it calls, with which arguments.

`distill_mode(name)` looks a mode up (`MODES` holds them, by name). Adding a mode is one subclass of
`DistillMode`, registered with `@register`, plus its `LogprobMode` value in the proto.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias, TypeVar

import torch
from transformers import PreTrainedModel

from cascade.algo import (
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
from cascade.algo.masking import SumOverRanks
from cascade.config import DistillConfig
from cascade.distill.samples import DistillSamples, SequenceScores, TeacherTokens, pad_rows
from cascade.engine.base import EngineRequestError
from cascade.engine.batch import SequenceBatch
from cascade.engine.logprobs import (
    DEFAULT_CHUNK_BYTES,
    completion_logits,
    completion_logprobs,
    gather_logprobs,
    needs_chunks,
    over_vocab_chunks,
)
from cascade.engine.microbatch import MicroBatching, micro_batch_spans
from cascade_proto.v1 import teacher_pb2 as pb

Mode: TypeAlias = str
"""A mode's name: a key of `MODES`."""


@dataclass(frozen=True)
class TeacherRequest:
    """One call to the teacher service: the scores of `mode` at `temperature` (`topk`: its k)."""

    mode: Mode
    temperature: float = 1.0
    topk: int = 0


class DistillMode(ABC):
    name: ClassVar[Mode]
    proto_enum: ClassVar[pb.LogprobMode]
    """Its `LogprobMode` value on the wire."""

    # ---------------------------------------------------------------- the learner's question

    def requests(self, cfg: DistillConfig, vocab_size: int) -> tuple[TeacherRequest, ...]:
        """The calls to the teacher service for one batch, in order; `remote_tokens` gets their
        replies in the same order. The first asks for this mode's own scores (at the
        distillation temperature when the teacher's tempered log-probs are the loss's input, at
        T=1 when the loss tempers them itself)."""
        return (TeacherRequest(self.name, self.teacher_temperature(cfg), min(cfg.topk, vocab_size)),)

    def teacher_temperature(self, cfg: DistillConfig) -> float:
        """The temperature of the teacher's scores (T=1: the loss applies T itself; tempering
        the teacher too would put it at T^2)."""
        return 1.0

    # ---------------------------------------------------------------- the teacher's tokens

    @abstractmethod
    def local_tokens(
        self,
        teacher: PreTrainedModel,
        sb: SequenceBatch,
        cfg: DistillConfig,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> TeacherTokens:
        """The teacher's tokens computed in this process (`sb` on the teacher's device, no grad;
        the vocabulary in chunks of `chunk_bytes` where the mode allows)."""

    @abstractmethod
    def remote_tokens(self, replies: Sequence[list[SequenceScores]], sb: SequenceBatch) -> TeacherTokens:
        """The teacher service's replies to `requests` (a later one may be missing: its tokens
        are then None) on the learner's batch layout."""

    def _pad(self, name: str, rows: list[SequenceScores], sb: SequenceBatch) -> torch.Tensor:
        values = [getattr(r, name) for r in rows]
        if any(v is None for v in values):
            raise ValueError(f"teacher reply lacks {name} for a {self.name} loss")
        return pad_rows(values, sb.completion_ids.shape[1])

    # ---------------------------------------------------------------- the teacher side

    def check_request(self, topk: int, vocab_size: int) -> None:  # noqa: B027 - most modes check nothing
        """Raise `EngineRequestError` when a scoring request's mode arguments are wrong."""

    @abstractmethod
    def score(self, lp: torch.Tensor, topk: int, tokens: torch.Tensor) -> SequenceScores:
        """One sequence's scores from its completion positions' log-probs `lp` [n, V] (at the
        request's temperature) and its completion `tokens` [n]; tensors on the CPU."""

    def reply_topk(self, topk: int) -> int:
        """The reply's `topk` field (the k of its `topk_*` rows; 0 without them)."""
        return 0

    def reply_size_error(self, tokens: int, vocab_size: int, max_message_bytes: int) -> str | None:
        """Why a reply for `tokens` completion tokens would not fit in one message, or None."""
        return None

    # ---------------------------------------------------------------- the loss

    @abstractmethod
    def loss(
        self,
        model: PreTrainedModel,
        sb: SequenceBatch,
        teacher: TeacherTokens,
        samples: DistillSamples,
        cfg: DistillConfig,
        reduce: SumOverRanks | None = None,
    ) -> DistillLossOutput:
        """The student's (`model`) loss against the teacher's tokens; `sb` and `teacher` are on the
        student's device. With `reduce` the rows are one rank's share (see `SumOverRanks`)."""

    @abstractmethod
    def micro_loss(
        self,
        model: PreTrainedModel,
        sb: SequenceBatch,
        teacher: TeacherTokens,
        samples: DistillSamples,
        cfg: DistillConfig,
        *,
        step_tokens: torch.Tensor,
        chunk_bytes: int,
    ) -> DistillLossOutput:
        """`loss` on one micro-batch of a step whose counted tokens (every rank's) are
        `step_tokens`: the loss and every metric are this micro-batch's part of the step's
        (they add up over micro-batches and ranks), the student's logits taken in vocabulary
        chunks of `chunk_bytes` when the micro-batch's would not fit. A mode whose loss
        denominator is known only after the step's forwards (`defers_count`) returns the
        numerator; the caller divides the term's gradient by `kept_count` of the summed metrics."""

    def defers_count(self, samples: DistillSamples, cfg: DistillConfig) -> bool:
        """Whether `micro_loss` returns an undivided sum (see there)."""
        return False

    def kept_count(self, metrics: dict[str, float]) -> float:
        """The step's loss denominator, from `micro_loss`'s metrics summed over the step."""
        return metrics["n_tokens"]


MODES: dict[Mode, DistillMode] = {}
"""Every mode, by name, in registration order."""

_M = TypeVar("_M", bound=type[DistillMode])


def register(cls: _M) -> _M:
    """Class decorator: `cls()` becomes the mode named `cls.name`."""
    if cls.name in MODES:
        raise ValueError(f"distillation mode {cls.name!r} registered twice")
    if any(m.proto_enum == cls.proto_enum for m in MODES.values()):
        raise ValueError(f"distillation mode {cls.name!r}: proto enum {cls.proto_enum} already taken")
    MODES[cls.name] = cls()
    return cls


class UnknownModeError(KeyError):
    """A mode name that is not in the registry; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0])


def distill_mode(name: str) -> DistillMode:
    """The mode named `name` (`UnknownModeError`, listing the valid names, for any other)."""
    try:
        return MODES[name]
    except KeyError:
        raise UnknownModeError(
            f"unknown distillation mode {name!r}; valid modes: {', '.join(MODES)}"
        ) from None


def mode_of_enum(value: int) -> DistillMode | None:
    """The mode whose `LogprobMode` is `value`, None when none is."""
    return next((m for m in MODES.values() if m.proto_enum == value), None)


def local_teacher_tokens(
    teacher: PreTrainedModel, sb: SequenceBatch, cfg: DistillConfig, batching: MicroBatching | None = None
) -> TeacherTokens:
    """The teacher's tokens computed in this process (embedded mode), on the teacher's device:
    with `batching`, over micro-batches of rows under its token budget (the rows keep the
    batch's layout) and the vocabulary in its chunks, as the learner's own forwards."""
    mode = distill_mode(cfg.loss)
    batching = batching or MicroBatching()
    sb = sb.to(teacher.device)
    rows, width = sb.input_ids.shape
    spans = micro_batch_spans([sb.prompt_len] * rows, [width - sb.prompt_len] * rows, batching)
    with torch.no_grad():
        if len(spans) <= 1:
            return mode.local_tokens(teacher, sb, cfg, batching.logits_chunk_bytes)
        parts = [
            mode.local_tokens(teacher, sb.rows(lo, hi), cfg, batching.logits_chunk_bytes) for lo, hi in spans
        ]
    return TeacherTokens.concat(parts)


def remote_teacher_tokens(
    scores: list[SequenceScores],
    sb: SequenceBatch,
    cfg: DistillConfig,
    *more: list[SequenceScores],
) -> TeacherTokens:
    """The teacher service's answer (`scores`: the reply to the mode's first request; `more`: to
    its further ones) on the learner's batch layout."""
    return distill_mode(cfg.loss).remote_tokens([scores, *more], sb)


class _TopkScores:
    """A chunk's top-k T=1 log-probs and ids, and the sampled token's T=1 log-prob."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lp = torch.log_softmax(logits, dim=-1)
        top_lp, top_ids = lp.topk(min(self.k, lp.shape[-1]), dim=-1)
        return top_lp, top_ids, lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _token_logprob_t1(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The sampled token's T=1 log-prob (for the reverse-KL metric: no gradient)."""
    with torch.no_grad():
        return torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _token_scores(lp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float().cpu()


# --------------------------------------------------------------------------- sampled


@register
class SampledMode(DistillMode):
    """One float per token on the wire: the teacher's log-prob of each completion token at the
    distillation temperature; the loss is `sampled_distill_loss` (MOPD)."""

    name = "sampled"
    proto_enum = pb.LOGPROB_MODE_SAMPLED

    def teacher_temperature(self, cfg: DistillConfig) -> float:
        return cfg.temperature

    def local_tokens(
        self,
        teacher: PreTrainedModel,
        sb: SequenceBatch,
        cfg: DistillConfig,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> TeacherTokens:
        return TeacherTokens(
            logprobs=completion_logprobs(teacher, sb, cfg.temperature, chunk_bytes=chunk_bytes)
        )

    def remote_tokens(self, replies: Sequence[list[SequenceScores]], sb: SequenceBatch) -> TeacherTokens:
        return TeacherTokens(logprobs=self._pad("logprobs", replies[0], sb))

    def score(self, lp: torch.Tensor, topk: int, tokens: torch.Tensor) -> SequenceScores:
        return SequenceScores(logprobs=_token_scores(lp, tokens))

    def loss(
        self,
        model: PreTrainedModel,
        sb: SequenceBatch,
        teacher: TeacherTokens,
        samples: DistillSamples,
        cfg: DistillConfig,
        reduce: SumOverRanks | None = None,
    ) -> DistillLossOutput:
        assert teacher.logprobs is not None
        t = cfg.temperature
        student = completion_logprobs(model, sb, t)
        rollout = self._rollout(samples, cfg, sb, model.device)
        return sampled_distill_loss(
            SampledDistillInput(
                student_logprobs=student,
                teacher_logprobs=teacher.logprobs,
                mask=sb.completion_mask,
                rollout_logprobs=rollout,
                reduce=reduce,
            )
        )

    @staticmethod
    def _rollout(
        samples: DistillSamples, cfg: DistillConfig, sb: SequenceBatch, device: torch.device
    ) -> torch.Tensor | None:
        """The rollout's log-probs when they are at the loss's temperature (None otherwise:
        the loss then takes the batch as on-policy)."""
        if abs(samples.temperature - cfg.temperature) >= 1e-9:
            return None
        return samples.padded_rollout_logprobs(sb.completion_ids.shape[1]).to(device)

    def micro_loss(
        self,
        model: PreTrainedModel,
        sb: SequenceBatch,
        teacher: TeacherTokens,
        samples: DistillSamples,
        cfg: DistillConfig,
        *,
        step_tokens: torch.Tensor,
        chunk_bytes: int,
    ) -> DistillLossOutput:
        assert teacher.logprobs is not None
        rollout = self._rollout(samples, cfg, sb, model.device)
        return sampled_distill_loss(
            SampledDistillInput(
                student_logprobs=completion_logprobs(model, sb, cfg.temperature, chunk_bytes=chunk_bytes),
                teacher_logprobs=teacher.logprobs,
                mask=sb.completion_mask,
                rollout_logprobs=rollout,
                step_tokens=step_tokens,
                # the kept tokens depend on the student's log-probs: counted over the step first
                step_kept=step_tokens if rollout is None else torch.ones((), device=model.device),
            )
        )

    def defers_count(self, samples: DistillSamples, cfg: DistillConfig) -> bool:
        return abs(samples.temperature - cfg.temperature) < 1e-9

    def kept_count(self, metrics: dict[str, float]) -> float:
        """kept_fraction's parts are kept tokens over the step's counted tokens."""
        return round(metrics["kept_fraction"] * metrics["n_tokens"])


# --------------------------------------------------------------------------- distributions


class DistributionMode(DistillMode):
    """A mode whose loss matches (part of) the teacher's distribution at each token, over the
    student's T=1 logits (`loss_of`), and reports the reverse KL at the sampled tokens
    (`reverse_kl`) when the teacher's log-probs of those tokens are known (`teacher_token_logprobs`)."""

    @abstractmethod
    def loss_of(
        self,
        student_logits: torch.Tensor,
        teacher: TeacherTokens,
        sb: SequenceBatch,
        cfg: DistillConfig,
        reduce: SumOverRanks | None,
        step_tokens: torch.Tensor | None = None,
    ) -> DistillLossOutput: ...

    @abstractmethod
    def teacher_token_logprobs(self, teacher: TeacherTokens, sb: SequenceBatch) -> torch.Tensor | None: ...

    @abstractmethod
    def chunk_inputs(
        self, teacher: TeacherTokens, sb: SequenceBatch, cfg: DistillConfig
    ) -> tuple[Callable[..., tuple[torch.Tensor, ...]], list[torch.Tensor]]:
        """The per-token function over a chunk of the student's logits (the KL term, with grad;
        the sampled token's T=1 log-prob, without) and the teacher's [B, C, ...] tensors it reads."""

    def micro_loss(
        self,
        model: PreTrainedModel,
        sb: SequenceBatch,
        teacher: TeacherTokens,
        samples: DistillSamples,
        cfg: DistillConfig,
        *,
        step_tokens: torch.Tensor,
        chunk_bytes: int,
    ) -> DistillLossOutput:
        if not needs_chunks(model, sb, chunk_bytes):
            student_logits = completion_logits(model, sb, 1.0)
            out = self.loss_of(student_logits, teacher, sb, cfg, None, step_tokens)
            with torch.no_grad():
                student_lp = gather_logprobs(student_logits, sb.completion_ids)
        else:
            fn, extras = self.chunk_inputs(teacher, sb, cfg)
            kl, student_lp = over_vocab_chunks(model, sb, fn, extras, chunk_bytes=chunk_bytes)
            out = token_kl_loss(kl, sb.completion_mask, cfg.temperature, count=step_tokens)
        teacher_lp = self.teacher_token_logprobs(teacher, sb)
        if teacher_lp is not None:
            m = sb.completion_mask > 0
            gap = torch.where(m, student_lp.detach() - teacher_lp, torch.zeros_like(student_lp)).sum()
            out.metrics["reverse_kl"] = float(gap) / float(step_tokens.clamp(min=1))
        return out

    def loss(
        self,
        model: PreTrainedModel,
        sb: SequenceBatch,
        teacher: TeacherTokens,
        samples: DistillSamples,
        cfg: DistillConfig,
        reduce: SumOverRanks | None = None,
    ) -> DistillLossOutput:
        student_logits = completion_logits(model, sb, 1.0)
        out = self.loss_of(student_logits, teacher, sb, cfg, reduce)
        teacher_lp = self.teacher_token_logprobs(teacher, sb)
        if teacher_lp is not None:
            out.metrics["reverse_kl"] = reverse_kl(student_logits, teacher_lp, sb, reduce)
        return out


@torch.no_grad()
def reverse_kl(
    student_logits: torch.Tensor, teacher_lp: torch.Tensor, sb: SequenceBatch, reduce: SumOverRanks | None
) -> float:
    """Mean `log p_student - log p_teacher` of the completion tokens over the counted positions."""
    student_lp = gather_logprobs(student_logits, sb.completion_ids)
    m = sb.completion_mask
    # masked positions replaced, not multiplied: a teacher's value there is no input
    gap = torch.where(m > 0, student_lp - teacher_lp, torch.zeros_like(student_lp)).sum()
    if reduce is None:
        kl = gap / m.sum().clamp(min=1)
    else:
        kl = reduce(gap) / reduce(m.sum()).clamp(min=1)
    return float(kl)


@register
class TopkMode(DistributionMode):
    """k ids and their T=1 log-probs per token on the wire (`topk_distill_loss`); one more pass,
    the completion tokens' T=1 log-probs, for the reverse-KL metric."""

    name = "topk"
    proto_enum = pb.LOGPROB_MODE_TOPK

    def requests(self, cfg: DistillConfig, vocab_size: int) -> tuple[TeacherRequest, ...]:
        return (*super().requests(cfg, vocab_size), TeacherRequest(SampledMode.name))

    def local_tokens(
        self,
        teacher: PreTrainedModel,
        sb: SequenceBatch,
        cfg: DistillConfig,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> TeacherTokens:
        if needs_chunks(teacher, sb, chunk_bytes):
            top_lp, top_ids, lp_t1 = over_vocab_chunks(
                teacher, sb, _TopkScores(cfg.topk), chunk_bytes=chunk_bytes
            )
            return TeacherTokens(topk_ids=top_ids, topk_logprobs=top_lp, logprobs_t1=lp_t1)
        logits = completion_logits(teacher, sb, 1.0)
        k = min(cfg.topk, logits.shape[-1])
        # Untempered (T = 1) log-probs: topk_distill_loss applies T itself (tempering here
        # too would put the teacher at T^2).
        top_lp, top_ids = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        return TeacherTokens(
            topk_ids=top_ids, topk_logprobs=top_lp, logprobs_t1=gather_logprobs(logits, sb.completion_ids)
        )

    def remote_tokens(self, replies: Sequence[list[SequenceScores]], sb: SequenceBatch) -> TeacherTokens:
        return TeacherTokens(
            topk_ids=self._pad("topk_ids", replies[0], sb).long(),
            topk_logprobs=self._pad("topk_logprobs", replies[0], sb),
            logprobs_t1=self._pad("logprobs", replies[1], sb) if len(replies) > 1 else None,
        )

    def check_request(self, topk: int, vocab_size: int) -> None:
        if not 1 <= topk <= vocab_size:
            raise EngineRequestError(f"topk: must be in [1, {vocab_size}] for mode {self.name} (got {topk})")

    def score(self, lp: torch.Tensor, topk: int, tokens: torch.Tensor) -> SequenceScores:
        values, ids = lp.topk(min(topk, lp.shape[-1]), dim=-1)
        return SequenceScores(topk_ids=ids.cpu(), topk_logprobs=values.float().cpu())

    def reply_topk(self, topk: int) -> int:
        return topk

    def loss_of(
        self,
        student_logits: torch.Tensor,
        teacher: TeacherTokens,
        sb: SequenceBatch,
        cfg: DistillConfig,
        reduce: SumOverRanks | None,
        step_tokens: torch.Tensor | None = None,
    ) -> DistillLossOutput:
        assert teacher.topk_ids is not None and teacher.topk_logprobs is not None
        return topk_distill_loss(
            TopkDistillInput(
                student_logits=student_logits,
                teacher_topk_ids=teacher.topk_ids,
                teacher_topk_logprobs=teacher.topk_logprobs,
                mask=sb.completion_mask,
                temperature=cfg.temperature,
                reduce=reduce,
                step_tokens=step_tokens,
            )
        )

    def chunk_inputs(
        self, teacher: TeacherTokens, sb: SequenceBatch, cfg: DistillConfig
    ) -> tuple[Callable[..., tuple[torch.Tensor, ...]], list[torch.Tensor]]:
        assert teacher.topk_ids is not None and teacher.topk_logprobs is not None
        t = cfg.temperature

        def fn(
            logits: torch.Tensor, ids: torch.Tensor, k_ids: torch.Tensor, k_lp: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            if k_ids.numel() and (int(k_ids.min()) < 0 or int(k_ids.max()) >= logits.shape[-1]):
                raise ValueError(f"teacher_topk_ids out of range for vocabulary size {logits.shape[-1]}")
            return topk_token_kl(logits, k_ids, k_lp, t), _token_logprob_t1(logits, ids)

        return fn, [teacher.topk_ids, teacher.topk_logprobs]

    def teacher_token_logprobs(self, teacher: TeacherTokens, sb: SequenceBatch) -> torch.Tensor | None:
        return teacher.logprobs_t1


@register
class FullMode(DistributionMode):
    """The whole vocabulary per token on the wire (`full_distill_loss`)."""

    name = "full"
    proto_enum = pb.LOGPROB_MODE_FULL

    def local_tokens(
        self,
        teacher: PreTrainedModel,
        sb: SequenceBatch,
        cfg: DistillConfig,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> TeacherTokens:
        # the whole distribution is this mode's data: [rows, C, V] of one micro-batch of rows
        return TeacherTokens(logits=completion_logits(teacher, sb, 1.0))

    def remote_tokens(self, replies: Sequence[list[SequenceScores]], sb: SequenceBatch) -> TeacherTokens:
        return TeacherTokens(logits=self._pad("full_logprobs", replies[0], sb))

    def score(self, lp: torch.Tensor, topk: int, tokens: torch.Tensor) -> SequenceScores:
        return SequenceScores(full_logprobs=lp.float().cpu())

    def reply_size_error(self, tokens: int, vocab_size: int, max_message_bytes: int) -> str | None:
        size = tokens * vocab_size * 4  # float32 per vocabulary entry
        if size <= max_message_bytes:
            return None
        return (
            f"{self.name} log-probs for {tokens} tokens x {vocab_size} vocabulary "
            f"({size / 2**20:.0f} MiB) exceed the "
            f"{max_message_bytes / 2**20:.0f} MiB message limit: "
            f"send fewer sequences or use {TopkMode.name}"
        )

    def loss_of(
        self,
        student_logits: torch.Tensor,
        teacher: TeacherTokens,
        sb: SequenceBatch,
        cfg: DistillConfig,
        reduce: SumOverRanks | None,
        step_tokens: torch.Tensor | None = None,
    ) -> DistillLossOutput:
        assert teacher.logits is not None
        return full_distill_loss(
            FullDistillInput(
                student_logits=student_logits,
                teacher_logits=teacher.logits,
                mask=sb.completion_mask,
                temperature=cfg.temperature,
                reduce=reduce,
                step_tokens=step_tokens,
            )
        )

    def chunk_inputs(
        self, teacher: TeacherTokens, sb: SequenceBatch, cfg: DistillConfig
    ) -> tuple[Callable[..., tuple[torch.Tensor, ...]], list[torch.Tensor]]:
        assert teacher.logits is not None
        t = cfg.temperature

        def fn(
            logits: torch.Tensor, ids: torch.Tensor, teacher_logits: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            return full_token_kl(logits, teacher_logits, t), _token_logprob_t1(logits, ids)

        return fn, [teacher.logits]

    def teacher_token_logprobs(self, teacher: TeacherTokens, sb: SequenceBatch) -> torch.Tensor | None:
        return gather_logprobs(teacher.logits, sb.completion_ids) if teacher.logits is not None else None

"""How a learner step is cut into forward+backward passes that fit: micro-batches bounded by
padded tokens (and optionally by sequences), and the size of one vocabulary chunk.

The cut is contiguous in the step's row order (a GRPO group's rows stay together, so the
shared-prompt forward still serves them), greedy, and never splits a row: a row longer than the
budget is a micro-batch of its own. What the cut must never change is the loss: the terms
normalise over the whole step before it (`cascade.algo.grpo.grpo_normalisers`, the distillation
terms' step token counts), so any cut gives the same update to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

from cascade.config import LearnerConfig

MIB = 2**20


@dataclass(frozen=True)
class MicroBatching:
    """The learner's memory settings for one update (from `learner.*`)."""

    tokens: int | None = None
    """Padded tokens per micro-batch; None: no bound."""
    sequences: int | None = None
    """Sequences per micro-batch; None: no bound."""
    logits_chunk_bytes: int = 256 * MIB
    """The float32 logits one vocabulary chunk may hold."""
    activation_checkpointing: bool = False

    @classmethod
    def of(cls, cfg: LearnerConfig) -> MicroBatching:
        return cls(
            tokens=cfg.micro_batch_tokens,
            sequences=cfg.micro_batch_sequences,
            logits_chunk_bytes=int(cfg.logits_chunk_mib * MIB),
            activation_checkpointing=cfg.activation_checkpointing,
        )

    def chunk_rows(self, vocab: int) -> int:
        """Token positions per vocabulary chunk (at least one)."""
        return max(1, self.logits_chunk_bytes // (4 * vocab))


Span = tuple[int, int]
"""Rows `[lo, hi)` of a step; `lo == hi` is an empty micro-batch (a rank's placeholder pass)."""


def micro_batch_spans(
    prompt_lens: list[int],
    completion_lens: list[int],
    batching: MicroBatching,
    *,
    at_least: int = 1,
) -> list[Span]:
    """Contiguous spans of rows, each within the budget: `rows x (longest prompt + longest
    completion)` padded tokens at most `batching.tokens`, at most `batching.sequences` rows.

    `at_least`: pad the list with empty spans up to this count (every rank of a sharded model
    must run as many forward and backward passes as the others)."""
    if len(prompt_lens) != len(completion_lens):
        raise ValueError(f"{len(prompt_lens)} prompt lengths for {len(completion_lens)} completions")
    spans: list[Span] = []
    lo, p_max, c_max = 0, 0, 0
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        c = max(c, 1)  # a row is at least one completion column wide (`right_pad`)
        rows = i - lo + 1
        wide_p, wide_c = max(p_max, p), max(c_max, c)
        over_tokens = batching.tokens is not None and rows * (wide_p + wide_c) > batching.tokens
        over_rows = batching.sequences is not None and rows > batching.sequences
        if rows > 1 and (over_tokens or over_rows):
            spans.append((lo, i))
            lo, wide_p, wide_c = i, p, c
        p_max, c_max = wide_p, wide_c
    if lo < len(prompt_lens):
        spans.append((lo, len(prompt_lens)))
    end = len(prompt_lens)
    while len(spans) < at_least:
        spans.append((end, end))
    return spans


def padded_tokens(prompt_lens: list[int], completion_lens: list[int], spans: list[Span]) -> tuple[int, int]:
    """(real tokens, padded tokens) of the rows over `spans`: their ratio is the step's padding share."""
    real = sum(prompt_lens) + sum(completion_lens)
    padded = sum(
        (hi - lo) * (max(prompt_lens[lo:hi]) + max(1, max(completion_lens[lo:hi])))
        for lo, hi in spans
        if hi > lo
    )
    return real, padded

"""A frozen model's log-probs on given (prompt, completion) tokens: what a teacher sends back.

It is the learner's own computation (`cascade.engine.logprobs.completion_logits` on a
`build_batch` layout), so a teacher service's answer equals what the embedded runner computes
in-process for the same tokens. The request's mode (`cascade.distill.modes`) says how much of the
distribution goes on the wire (`DistillMode.score`).

Memory is the scorer's to bound, not the request's (`MicroBatching`, from the teacher service's
`--max-batch-tokens`, `--max-batch-sequences` and `--logits-chunk-mib`):

- the sequences go through the model in micro-batches of at most `tokens` padded tokens and
  `sequences` rows (`cascade.engine.microbatch.micro_batch_spans`: contiguous, never splitting a
  sequence);
- a micro-batch whose float32 logits over every position would pass `logits_chunk_bytes` never
  builds them: the model runs with its output layer set aside
  (`cascade.engine.logprobs.hidden_states_out`), and the output layer, the float32 cast, the
  temperature and the log-softmax run over chunks of `chunk_rows(V)` completion positions, each
  chunk handed to the modes' `score` and dropped. Only `full` keeps [n, V] per sequence: it is its
  answer (and its reply is bounded by the message limit). A model whose logits are not its output
  layer's output (soft-capped, scaled: `cascade.engine.logprobs.output_layer`) takes the plain
  forward per micro-batch, whatever its size.

A micro-batch that fits takes the plain forward, bit for bit the computation of the unbounded
scorer (and of the embedded runner on the same batch). The chunked one computes every position's
log-probs with the same operations on fewer rows at a time; a micro-batch cut differently pads
differently. Both agree with the unbounded scorer to float rounding (float32: within 1e-5,
tested), not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from itertools import accumulate

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from cascade.distill.modes import MODES, DistillMode, Mode, distill_mode
from cascade.distill.samples import SequenceScores
from cascade.engine.base import EngineRequestError
from cascade.engine.batch import SequenceBatch, build_batch
from cascade.engine.logprobs import completion_logits, hidden_states_out, needs_chunks
from cascade.engine.microbatch import MicroBatching, micro_batch_spans

UNBOUNDED = MicroBatching(tokens=None, sequences=64, logits_chunk_bytes=2**62)
"""No bound but 64 sequences per forward: every micro-batch takes the plain forward."""


@dataclass(frozen=True)
class ScoreRequest:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    mode: Mode
    temperature: float = 1.0
    topk: int = 0


@dataclass(frozen=True)
class _Row:
    """One sequence of one request, as a micro-batch scores it."""

    request: int
    sequence: int
    mode: DistillMode
    topk: int
    tokens: list[int]


@torch.inference_mode()
def score_sequences(
    model: PreTrainedModel,
    requests: list[ScoreRequest],
    *,
    pad_id: int,
    batching: MicroBatching = UNBOUNDED,
) -> list[list[SequenceScores]]:
    """Score several requests with shared forwards: sequences of requests that have the same
    temperature go through the model together, in micro-batches within `batching` (`tokens`
    padded tokens, `sequences` rows, `logits_chunk_bytes` of float32 logits at a time).

    Returns one list of `SequenceScores` per request, in order (tensors on the CPU).
    """
    out: list[list[SequenceScores]] = [[SequenceScores() for _ in r.completion_ids] for r in requests]
    rows: dict[float, list[_Row]] = {}
    for ri, req in enumerate(requests):
        mode = distill_mode(req.mode)
        for si, completion in enumerate(req.completion_ids):
            rows.setdefault(req.temperature, []).append(_Row(ri, si, mode, req.topk, completion))
    for temperature, members in rows.items():
        prompts = [requests[r.request].prompt_ids[r.sequence] for r in members]
        lengths = [len(r.tokens) for r in members]
        for lo, hi in micro_batch_spans([len(p) for p in prompts], lengths, batching):
            batch = build_batch(prompts[lo:hi], [r.tokens for r in members[lo:hi]], pad_id)
            if needs_chunks(model, batch, batching.logits_chunk_bytes):
                scores = _score_in_chunks(model, batch, members[lo:hi], temperature, batching)
            else:
                scores = _score_whole(model, batch, members[lo:hi], temperature)
            for row, s in zip(members[lo:hi], scores, strict=True):
                out[row.request][row.sequence] = s
    return out


def _score_whole(
    model: PreTrainedModel, batch: SequenceBatch, rows: list[_Row], temperature: float
) -> list[SequenceScores]:
    """The plain forward: the micro-batch's log-probs [B, C, V] at once."""
    device = model.device
    logp = torch.log_softmax(completion_logits(model, batch, temperature), dim=-1)  # [B, C, V]
    scores = []
    for i, row in enumerate(rows):
        tokens = torch.tensor(row.tokens, device=device)
        scores.append(row.mode.score(logp[i, : len(row.tokens)], row.topk, tokens))
    return scores


def _score_in_chunks(
    model: PreTrainedModel,
    batch: SequenceBatch,
    rows: list[_Row],
    temperature: float,
    batching: MicroBatching,
) -> list[SequenceScores]:
    """The micro-batch's hidden states, then its completion positions' log-probs `chunk_rows(V)`
    positions at a time (the learner's `over_vocab_chunks` does the same per chunk), each chunk
    scored by the modes of the sequences it covers."""
    batch = batch.to(model.device)
    p = batch.prompt_len
    c = batch.completion_ids.shape[1]
    with hidden_states_out(model) as head:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
    where = torch.nonzero(batch.completion_mask > 0, as_tuple=True)  # row-major: row i's tokens in order
    hidden = out.logits[:, p - 1 : p - 1 + c][where]  # [n, H]: the completion positions only
    del out
    ids = batch.completion_ids[where]
    weight = head.weight.to(hidden.dtype)
    bias = None if head.bias is None else head.bias.to(hidden.dtype)
    step = batching.chunk_rows(int(weight.shape[0]))
    ends = list(accumulate(len(r.tokens) for r in rows))
    starts = [end - len(r.tokens) for end, r in zip(ends, rows, strict=True)]
    parts: list[list[SequenceScores]] = [[] for _ in rows]
    first = 0  # the first sequence not scored to its end yet
    for lo in range(0, hidden.shape[0], step):
        hi = min(lo + step, hidden.shape[0])
        logits = F.linear(hidden[lo:hi], weight, bias).float()  # a fresh tensor: divided in place
        lp = torch.log_softmax(logits.div_(temperature), dim=-1)  # [hi - lo, V]
        del logits
        for i in range(first, len(rows)):
            if starts[i] >= hi:
                break
            a, b = max(starts[i], lo), min(ends[i], hi)
            parts[i].append(rows[i].mode.score(lp[a - lo : b - lo], rows[i].topk, ids[a:b]))
            if ends[i] <= hi:
                first = i + 1
        del lp
    return [_concat(p) for p in parts]


def _concat(parts: list[SequenceScores]) -> SequenceScores:
    """One sequence's scores from its chunks' (in order)."""
    if len(parts) == 1:
        return parts[0]
    values: dict[str, torch.Tensor | None] = {}
    for f in fields(SequenceScores):
        pieces = [getattr(s, f.name) for s in parts]
        values[f.name] = None if pieces[0] is None else torch.cat(pieces, dim=0)
    return SequenceScores(**values)


def check_score_request(req: ScoreRequest, *, vocab_size: int, max_context: int) -> None:
    """Raise EngineRequestError naming the first thing wrong with a scoring request."""
    if req.mode not in MODES:
        raise EngineRequestError(f"mode: {req.mode!r} not one of {tuple(MODES)}")
    if not req.temperature > 0:
        raise EngineRequestError(f"temperature: must be > 0 (got {req.temperature})")
    MODES[req.mode].check_request(req.topk, vocab_size)
    if not req.completion_ids:
        raise EngineRequestError("sequences: empty (at least one sequence)")
    if len(req.prompt_ids) != len(req.completion_ids):
        raise EngineRequestError(f"{len(req.prompt_ids)} prompts for {len(req.completion_ids)} completions")
    for i, (prompt, completion) in enumerate(zip(req.prompt_ids, req.completion_ids, strict=True)):
        if not prompt:
            raise EngineRequestError(f"sequences[{i}].prompt_ids: empty prompt (at least one token)")
        if not completion:
            raise EngineRequestError(f"sequences[{i}].completion_ids: empty (at least one token)")
        for field, ids in (("prompt_ids", prompt), ("completion_ids", completion)):
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise EngineRequestError(
                    f"sequences[{i}].{field}: token id {bad} out of the vocabulary [0, {vocab_size})"
                )
        if len(prompt) + len(completion) > max_context:
            raise EngineRequestError(
                f"sequences[{i}]: {len(prompt)} + {len(completion)} tokens exceed the teacher's context "
                f"of {max_context} tokens"
            )

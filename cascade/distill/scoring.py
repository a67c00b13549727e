"""A frozen model's log-probs on given (prompt, completion) tokens: what a teacher sends back.

It is the learner's own computation (`cascade.engine.logprobs.completion_logits` on a
`build_batch` layout), so a teacher service's answer equals what the embedded runner computes
in-process for the same tokens. The request's mode (`cascade.distill.modes`) says how much of the
distribution goes on the wire (`DistillMode.score`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from cascade.distill.modes import MODES, Mode, distill_mode
from cascade.distill.samples import SequenceScores
from cascade.engine.base import EngineRequestError
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logits


@dataclass(frozen=True)
class ScoreRequest:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    mode: Mode
    temperature: float = 1.0
    topk: int = 0


@torch.inference_mode()
def score_sequences(
    model: PreTrainedModel, requests: list[ScoreRequest], *, pad_id: int, max_batch: int = 64
) -> list[list[SequenceScores]]:
    """Score several requests with shared forwards: sequences of requests that have the same
    temperature go through the model together, `max_batch` rows at a time.

    Returns one list of `SequenceScores` per request, in order (tensors on the CPU).
    """
    out: list[list[SequenceScores]] = [[SequenceScores() for _ in r.completion_ids] for r in requests]
    rows: dict[float, list[tuple[int, int]]] = {}
    for ri, req in enumerate(requests):
        for si in range(len(req.completion_ids)):
            rows.setdefault(req.temperature, []).append((ri, si))
    device = model.device
    for temperature, members in rows.items():
        for start in range(0, len(members), max_batch):
            chunk = members[start : start + max_batch]
            batch = build_batch(
                [requests[ri].prompt_ids[si] for ri, si in chunk],
                [requests[ri].completion_ids[si] for ri, si in chunk],
                pad_id,
            )
            batch.input_ids = batch.input_ids.to(device)
            batch.attention_mask = batch.attention_mask.to(device)
            batch.position_ids = batch.position_ids.to(device)
            logp = torch.log_softmax(completion_logits(model, batch, temperature), dim=-1)  # [B, C, V]
            for row, (ri, si) in enumerate(chunk):
                req = requests[ri]
                n = len(req.completion_ids[si])
                lp = logp[row, :n]  # [n, V]
                tokens = torch.tensor(req.completion_ids[si], device=device)
                out[ri][si] = distill_mode(req.mode).score(lp, req.topk, tokens)
    return out


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

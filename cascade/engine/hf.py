"""Batched sampling with a KV cache on a Hugging Face causal LM, keeping per-token log-probs.

Written by hand rather than with `model.generate` so that the log-probs it returns are the
ones the learner recomputes (same temperature scaling, same position ids, full-vocabulary
softmax before top-p truncation).

Where the time goes, and what is done about it (a GRPO step asks for G completions of each
prompt, each decode step is a batch of one token per row):

- prompts that repeat (the G copies of a group's prompt) are run through the prefill once and
  their keys/values copied to every row that shares them;
- decode steps run through `cascade.engine.decode.StaticDecoder` (a preallocated cache, no HF
  mask or cache machinery per token) on the architectures it supports, the HF forward with a
  `DynamicCache` otherwise;
- a sampled token costs one uniform draw per row (`cascade.engine.sampling`, inverse CDF over
  the row's probabilities), not one per vocabulary entry;
- rows that have finished leave the decode batch (once a quarter of it has), so the few long
  completions of a group that mostly stopped early decode alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from cascade.engine import decode
from cascade.engine.batch import left_pad, positions
from cascade.engine.sampling import draw_uniform, next_tokens


@dataclass
class Generation:
    completion_ids: list[list[int]]  # without padding, EOS included when produced
    logprobs: list[list[float]]  # one per completion token, at the sampling temperature
    finish_reasons: list[str]  # "stop" (EOS) or "length" (token budget)


def _share_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """The distinct prompts, in first-seen order, and for each row the index of its prompt."""
    first: dict[tuple[int, ...], int] = {}
    rows = [first.setdefault(tuple(p), len(first)) for p in prompts]
    distinct = [list(p) for p in first]
    return distinct, torch.tensor(rows, dtype=torch.long)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Generation:
    """Sample on the model's device (CPU or GPU); `generator` may live on any device."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    was_training = model.training
    model.eval()
    try:
        tok_mat, lp_mat, stopped = _decode(
            model, prompts, max_new_tokens, eos_ids, pad_id, temperature, top_p, greedy, generator
        )
    finally:
        model.train(was_training)
    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    reasons: list[str] = []
    eos_set = set(eos_ids)
    for i, row in enumerate(tok_mat.tolist()):
        end = len(row)
        for j, t in enumerate(row):
            if t in eos_set:
                end = j + 1
                break
        completions.append(row[:end])
        logprobs.append(lp_mat[i, :end].tolist())
        reasons.append("stop" if stopped[i] else "length")
    return Generation(completion_ids=completions, logprobs=logprobs, finish_reasons=reasons)


def _decode(
    model: PreTrainedModel,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    temperature: float,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
    """Tokens [B, C] (pad after a row's EOS), their log-probs [B, C] (0 there), stop flags."""
    device = model.device
    distinct, rows = _share_prompts(prompts)
    ids_u, attn_u = left_pad(distinct, pad_id)
    ids_u, attn_u, rows = ids_u.to(device), attn_u.to(device), rows.to(device)
    pos_u = positions(attn_u)
    cache = DynamicCache()
    out = model(input_ids=ids_u, attention_mask=attn_u, position_ids=pos_u, cache=cache, use_cache=True)
    logits = out.logits[:, -1, :].float().index_select(0, rows)  # [B, V]
    del out
    batch = len(prompts)
    steps = decode.stepper(
        model,
        cache,
        rows,
        attn_u.index_select(0, rows),
        pos_u[:, -1].index_select(0, rows) + 1,
        max_new_tokens - 1,
    )
    tok_mat = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    lp_mat = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    alive = torch.arange(batch, device=device)  # batch rows still in the decode batch
    done = torch.zeros(batch, dtype=torch.bool, device=device)  # per decode-batch row
    for step in range(max_new_tokens):
        uniform = None
        if not greedy:  # one draw per batch row every step, so a row's tokens never depend on others stopping
            uniform = draw_uniform(batch, generator, device).index_select(0, alive)
        tok, lp = next_tokens(logits, temperature=temperature, top_p=top_p, uniform=uniform)
        tok = tok.masked_fill(done, pad_id)
        tok_mat[alive, step] = tok
        lp_mat[alive, step] = lp.masked_fill(done, 0.0)
        hit_eos = torch.isin(tok, eos) & ~done
        stopped[alive[hit_eos]] = True
        done |= hit_eos
        if step == max_new_tokens - 1:
            break
        n_done = int(done.sum())
        if n_done == done.numel():
            break
        if 4 * n_done >= done.numel():  # a quarter of the batch finished: drop those rows
            idx = torch.nonzero(~done).squeeze(-1)
            steps.keep(idx)
            alive, tok, done = alive[idx], tok[idx], done[idx]
        logits = steps.step(tok, step).float()
    return tok_mat.cpu(), lp_mat.cpu(), stopped.tolist()

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
  completions of a group that mostly stopped early decode alone;
- a later round of a multi-turn rollout (`generate_kv` with `prefixes`) prefills only the ids
  the engine has not processed, on the keys/values it kept from the previous round
  (`cascade.engine.prefix_kv`), batched over the round's episodes: each row's kept keys/values
  left-padded to the longest, its new ids left-padded after them, every row at its own
  positions (the attention mask has a gap of padding between the two parts, which both the HF
  forward and `StaticDecoder` mask like any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from cascade.engine import decode
from cascade.engine.base import Generation
from cascade.engine.batch import left_pad, positions
from cascade.engine.prefix_kv import RowKV
from cascade.engine.sampling import draw_uniform, next_tokens


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
    gen, _ = generate_kv(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad_id=pad_id,
        temperature=temperature,
        top_p=top_p,
        greedy=greedy,
        generator=generator,
    )
    return gen


@torch.no_grad()
def generate_kv(
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
    prefixes: Sequence[RowKV] | None = None,
    keep: bool = False,
) -> tuple[Generation, list[RowKV | None]]:
    """`generate`, optionally on kept keys/values and keeping them for a next round.

    `prefixes[i]`: keys/values of a strict prefix of `prompts[i]` (only the rest is prefilled).
    `keep`: also return, for each row that stopped at an EOS, the keys/values of its prompt and
    its completion but the last token (that token is not fed to the model); None for the others
    (and for every row without `keep`). Without `prefixes` the tokens and log-probs are exactly
    `generate`'s: keeping only copies what was computed."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if prefixes is not None:
        if len(prefixes) != len(prompts):
            raise ValueError(f"{len(prefixes)} prefixes for {len(prompts)} prompts")
        for p, row in zip(prompts, prefixes, strict=True):
            if len(row.ids) >= len(p) or tuple(p[: len(row.ids)]) != row.ids:
                raise ValueError("every prefix must be a strict prefix of its prompt")
    was_training = model.training
    model.eval()
    try:
        tok_mat, lp_mat, stopped, kept = _decode(
            model,
            prompts,
            max_new_tokens,
            eos_ids,
            pad_id,
            temperature,
            top_p,
            greedy,
            generator,
            prefixes,
            keep,
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
    rows: list[RowKV | None] = [None] * len(prompts)
    for i, (keys, values) in kept.items():
        rows[i] = RowKV(tuple(prompts[i]) + tuple(completions[i][:-1]), keys, values)
    return Generation(completion_ids=completions, logprobs=logprobs, finish_reasons=reasons), rows


@dataclass
class _Prefill:
    cache: DynamicCache
    logits: Tensor  # [B, V] next-token logits of every batch row
    rows: Tensor  # [B] each batch row's row in the cache
    attn: Tensor  # [B, P] the batch's attention mask over the cache's P columns
    next_pos: Tensor  # [B] each row's first completion position


def _prefill(model: PreTrainedModel, prompts: list[list[int]], pad_id: int) -> _Prefill:
    """The whole prompts, left-padded, each distinct prompt once."""
    device = model.device
    distinct, rows = _share_prompts(prompts)
    ids_u, attn_u = left_pad(distinct, pad_id)
    ids_u, attn_u, rows = ids_u.to(device), attn_u.to(device), rows.to(device)
    pos_u = positions(attn_u)
    cache = DynamicCache()
    out = model(input_ids=ids_u, attention_mask=attn_u, position_ids=pos_u, cache=cache, use_cache=True)
    logits = out.logits[:, -1, :].float().index_select(0, rows)  # [B, V]
    del out
    return _Prefill(cache, logits, rows, attn_u.index_select(0, rows), pos_u[:, -1].index_select(0, rows) + 1)


def _prefill_on(
    model: PreTrainedModel, prompts: list[list[int]], prefixes: Sequence[RowKV], pad_id: int
) -> _Prefill:
    """Only the ids after each row's kept prefix: columns [pad, prefix | pad, new ids]."""
    device = model.device
    lengths = [len(p.ids) for p in prefixes]
    width, batch = max(lengths), len(prompts)
    new_ids, new_attn = left_pad([p[n:] for p, n in zip(prompts, lengths, strict=True)], pad_id)
    kept_attn = torch.zeros((batch, width), dtype=torch.long)
    for i, n in enumerate(lengths):
        kept_attn[i, width - n :] = 1
    attn = torch.cat([kept_attn, new_attn], dim=1).to(device)
    pos = positions(attn)
    cache = DynamicCache()
    for li in range(len(prefixes[0].keys)):
        k0, v0 = prefixes[0].keys[li], prefixes[0].values[li]
        keys = k0.new_zeros((batch, k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((batch, v0.shape[0], width, v0.shape[2]))
        for i, (row, n) in enumerate(zip(prefixes, lengths, strict=True)):
            keys[i, :, width - n :] = row.keys[li]
            values[i, :, width - n :] = row.values[li]
        cache.update(keys, values, li)
    # every position's logits, as `_prefill` takes them: with `logits_to_keep=1` the lm head
    # would see a strided slice, and torch's matmul folds that one way or another depending on
    # whether the weights require grad (the learner's policy does, the rollout service's not),
    # so the two paths would differ at float rounding
    out = model(
        input_ids=new_ids.to(device),
        attention_mask=attn,
        position_ids=pos[:, width:],
        cache=cache,
        use_cache=True,
    )
    logits = out.logits[:, -1, :].float()
    del out
    return _Prefill(cache, logits, torch.arange(batch, device=device), attn, pos[:, -1] + 1)


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
    prefixes: Sequence[RowKV] | None,
    keep: bool,
) -> tuple[Tensor, Tensor, list[bool], dict[int, tuple[list[Tensor], list[Tensor]]]]:
    """Tokens [B, C] (pad after a row's EOS), their log-probs [B, C] (0 there), stop flags, and
    with `keep` the keys/values of each row that stopped (prompt + completion but its EOS)."""
    device = model.device
    fill = (
        _prefill(model, prompts, pad_id)
        if prefixes is None
        else _prefill_on(model, prompts, prefixes, pad_id)
    )
    logits = fill.logits
    batch = len(prompts)
    steps = decode.stepper(model, fill.cache, fill.rows, fill.attn, fill.next_pos, max_new_tokens - 1)
    tok_mat = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    lp_mat = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    alive = torch.arange(batch, device=device)  # batch rows still in the decode batch
    done = torch.zeros(batch, dtype=torch.bool, device=device)  # per decode-batch row
    eos_step = [0] * batch  # with `keep`: the step at which each row sampled its EOS
    kept: dict[int, tuple[list[Tensor], list[Tensor]]] = {}
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
        if keep:
            for b in alive[hit_eos].tolist():
                eos_step[b] = step
        done |= hit_eos
        if step == max_new_tokens - 1:
            break
        n_done = int(done.sum())
        if n_done == done.numel():
            break
        if 4 * n_done >= done.numel():  # a quarter of the batch finished: drop those rows
            if keep:
                _keep_rows(steps, torch.nonzero(done).squeeze(-1), alive, fill.attn, eos_step, kept)
            idx = torch.nonzero(~done).squeeze(-1)
            steps.keep(idx)
            alive, tok, done = alive[idx], tok[idx], done[idx]
        logits = steps.step(tok, step).float()
    if keep:
        _keep_rows(steps, torch.nonzero(done).squeeze(-1), alive, fill.attn, eos_step, kept)
    return tok_mat.cpu(), lp_mat.cpu(), stopped.tolist(), kept


def _keep_rows(
    steps: decode.Stepper,
    idx: Tensor,
    alive: Tensor,
    attn: Tensor,
    eos_step: list[int],
    kept: dict[int, tuple[list[Tensor], list[Tensor]]],
) -> None:
    """Copy out the keys/values of decode-batch rows `idx` (all stopped at an EOS): the prompt's
    columns and one per completion token before the EOS, every one fed to the model already."""
    if idx.numel() == 0:
        return
    width = attn.shape[1]
    batch_rows = alive.index_select(0, idx).tolist()
    ends = [eos_step[b] for b in batch_rows]
    layers = steps.kv(idx, width + max(ends))
    for j, (b, end) in enumerate(zip(batch_rows, ends, strict=True)):
        cols = torch.cat(
            [torch.nonzero(attn[b]).squeeze(-1), torch.arange(width, width + end, device=attn.device)]
        )
        kept[b] = (
            [k[j].index_select(1, cols) for k, _ in layers],
            [v[j].index_select(1, cols) for _, v in layers],
        )

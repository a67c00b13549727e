"""Per-token log-probs of completion tokens (the learner's forward)."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache, PreTrainedModel

from cascade.engine import decode
from cascade.engine.batch import SequenceBatch


def completion_logits(model: PreTrainedModel, batch: SequenceBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits predicting each completion token: [B, C, V] float32 (whatever the model's dtype or
    autocast), divided by `temperature`; on the model's device.

    When rows share prompts (a GRPO group's G completions of one prompt), each distinct prompt
    goes through the model once and its keys/values serve every row that has it (gradients
    flow back through them as through G copies): the same logits, to float rounding, for about
    `distinct * P + B * C` token positions instead of `B * (P + C)`. Only on full-attention
    stacks `cascade.engine.decode` knows (a sliding-window cache keeps a window, not the prompt),
    and never on a model sharded with FSDP2: each call of it is a collective, and how many calls
    a batch takes must not depend on the rank's share of the data."""
    batch = batch.to(model.device)
    p = batch.prompt_len
    c = batch.completion_ids.shape[1]
    distinct, rows = torch.unique(batch.input_ids[:, :p], dim=0, return_inverse=True)
    sharded = isinstance(model, FSDPModule)  # every rank must make the same calls: one, always
    if sharded or 2 * distinct.shape[0] > batch.input_ids.shape[0] or not decode.supports(model):
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        logits = out.logits[:, p - 1 : p - 1 + c, :].float()
        return logits / temperature
    first = torch.full((distinct.shape[0],), batch.input_ids.shape[0], dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, rows, torch.arange(rows.shape[0], device=rows.device), "amin")
    cache = DynamicCache()
    prefix = model(
        input_ids=batch.input_ids[first, :p],
        attention_mask=batch.attention_mask[first, :p],
        position_ids=batch.position_ids[first, :p],
        cache=cache,
        use_cache=True,
    )  # all positions' logits: with `logits_to_keep=1` the lm_head reads a strided slice, whose
    # rounding depends on whether the weights require grad (a policy and its frozen copy would differ)
    parts = [prefix.logits[:, -1:, :].index_select(0, rows)]  # predicts completion token 0
    if c > 1:
        _expand_rows(cache, rows)
        rest = model(
            input_ids=batch.input_ids[:, p : p + c - 1],
            attention_mask=batch.attention_mask[:, : p + c - 1],
            position_ids=batch.position_ids[:, p : p + c - 1],
            cache=cache,
            use_cache=True,
        )
        parts.append(rest.logits)
    return torch.cat(parts, dim=1).float() / temperature


def _expand_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Give row i of the batch its prompt's keys and values (`rows[i]`), with `index_select`.

    Not `DynamicCache.batch_select_indices`: it indexes with `keys[rows, ...]`, whose backward is
    an accumulating `index_put_`; on a CPU with more than one thread that adds each row's gradient
    into its prompt's with atomic float adds, in whatever order the threads reach them. The
    gradients then change in their last bits from run to run (with other processes on the cores,
    nearly every step), and a seeded run drifts away from itself. The backward of `index_select`
    sums into each prompt in row order."""
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        assert isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)
        layer.keys, layer.values = keys.index_select(0, rows), values.index_select(0, rows)  # type: ignore[attr-defined,union-attr]


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token]: [B, C, V] x [B, C] -> [B, C]."""
    return torch.log_softmax(logits, dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def completion_logprobs(
    model: PreTrainedModel, batch: SequenceBatch, temperature: float = 1.0
) -> torch.Tensor:
    """[B, C] log-probs of the completion tokens at `temperature`; padding positions are 0."""
    batch = batch.to(model.device)
    logp = gather_logprobs(completion_logits(model, batch, temperature), batch.completion_ids)
    return logp * batch.completion_mask

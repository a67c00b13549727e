"""Per-token log-probs of completion tokens (the learner's forward).

Two ways to the same numbers. A batch whose whole logits fit in one vocabulary chunk takes the
plain forward: the model's logits [B, C, V] in float32, then log-softmax (the tiny models do,
bit for bit as they always did). A bigger one never builds them: the model runs with its output
layer set aside (`hidden_states_out`), the hidden states of the counted completion tokens are
gathered (padding and prompts cost no logits at all), and the output layer, the float32 cast
and the per-token function run chunk by chunk under `torch.utils.checkpoint`, so only one
chunk's logits exist at a time, in the forward and again in the backward (`over_vocab_chunks`).
This is what Liger-Kernel's fused linear cross-entropy and TRL's chunked log-probs do, written
with the checkpoint instead of a kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel

from cascade.engine import decode
from cascade.engine.batch import SequenceBatch
from cascade.engine.microbatch import MicroBatching

DEFAULT_CHUNK_BYTES = MicroBatching().logits_chunk_bytes

TokenFn = Callable[..., tuple[torch.Tensor, ...]]
"""`fn(logits [n, V] float32 at T=1, token_ids [n], *extras [n, ...]) -> per-token outputs [n, ...]`."""


def completion_logits(model: PreTrainedModel, batch: SequenceBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits predicting each completion token: [B, C, V] float32 (whatever the model's dtype or
    autocast), divided by `temperature`; on the model's device. The whole batch's logits at once:
    for a batch that may not fit, `over_vocab_chunks`.

    When rows share prompts (a GRPO group's G completions of one prompt), each distinct prompt
    goes through the model once and its keys/values serve every row that has it (gradients
    flow back through them as through G copies): the same logits, to float rounding, for about
    `distinct * P + B * C` token positions instead of `B * (P + C)`. Only on full-attention
    stacks `cascade.engine.decode` knows (a sliding-window cache keeps a window, not the prompt),
    and never on a model sharded with FSDP2: each call of it is a collective, and how many calls
    a batch takes must not depend on the rank's share of the data."""
    return _completion_outputs(model, batch).float() / temperature


def _completion_outputs(model: PreTrainedModel, batch: SequenceBatch) -> torch.Tensor:
    """The model's output at the positions predicting each completion token, [B, C, *], in the
    model's (or autocast's) dtype: logits, or hidden states under `hidden_states_out`."""
    batch = batch.to(model.device)
    p = batch.prompt_len
    c = batch.completion_ids.shape[1]
    distinct, rows = torch.unique(batch.input_ids[:, :p], dim=0, return_inverse=True)
    sharded = isinstance(model, FSDPModule)  # every rank must make the same calls: one, always
    # HF's gradient checkpointing turns the cache off in training mode: no shared prefix then
    recomputed = _recomputes(model) and model.training
    if (
        sharded
        or recomputed
        or 2 * distinct.shape[0] > batch.input_ids.shape[0]
        or not decode.supports(model)
    ):
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        return out.logits[:, p - 1 : p - 1 + c, :]
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
    return torch.cat(parts, dim=1)


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
    model: PreTrainedModel,
    batch: SequenceBatch,
    temperature: float = 1.0,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """[B, C] log-probs of the completion tokens at `temperature`; padding positions are 0.
    Over vocabulary chunks of `chunk_bytes` float32 logits when the whole batch's would not fit."""
    batch = batch.to(model.device)
    if not needs_chunks(model, batch, chunk_bytes):
        logp = gather_logprobs(completion_logits(model, batch, temperature), batch.completion_ids)
        return logp * batch.completion_mask
    (logp,) = over_vocab_chunks(model, batch, _TokenLogprob(temperature), chunk_bytes=chunk_bytes)
    return logp


def completion_logprobs_entropy(
    model: PreTrainedModel,
    batch: SequenceBatch,
    temperature: float = 1.0,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`completion_logprobs` and, without gradient, the entropy [B, C] of each position's
    distribution at `temperature` (0 at padding), from the same logits."""
    batch = batch.to(model.device)
    if not needs_chunks(model, batch, chunk_bytes):
        logits = completion_logits(model, batch, temperature)
        logp = gather_logprobs(logits, batch.completion_ids) * batch.completion_mask
        with torch.no_grad():
            entropy = _entropy(logits) * batch.completion_mask
        return logp, entropy
    logp, entropy = over_vocab_chunks(
        model, batch, _TokenLogprob(temperature, entropy=True), chunk_bytes=chunk_bytes
    )
    return logp, entropy


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits, dim=-1)
    return -(lp.exp() * lp).sum(dim=-1)


class _TokenLogprob:
    """The chunk function of `completion_logprobs`: the token's log-prob at `temperature`
    (and the distribution's entropy, detached)."""

    def __init__(self, temperature: float, *, entropy: bool = False) -> None:
        self.temperature = temperature
        self.entropy = entropy

    def __call__(self, logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lp = torch.log_softmax(logits / self.temperature, dim=-1)
        token = lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        if not self.entropy:
            return (token,)
        with torch.no_grad():
            ent = -(lp.exp() * lp).sum(dim=-1)
        return token, ent


# --------------------------------------------------------------------------- vocabulary chunks


def output_layer(model: PreTrainedModel) -> torch.nn.Linear | None:
    """The linear layer that maps hidden states to logits, when the logits are exactly its
    output (no soft-capping or scaling after it); None otherwise (such a model takes the plain
    forward, whatever its size)."""
    cfg = model.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    if getattr(cfg, "logits_scaling", 1.0) not in (None, 1.0):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if isinstance(head, torch.nn.Linear) else None


def _recomputes(model: PreTrainedModel) -> bool:
    """Whether the model's gradient checkpointing is on (transformers 5 renamed the flag)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def needs_chunks(model: PreTrainedModel, batch: SequenceBatch, chunk_bytes: int) -> bool:
    """Whether the plain forward's float32 logits over every position of `batch` would pass
    `chunk_bytes` (and the model's output layer can be chunked)."""
    head = output_layer(model)
    rows, cols = batch.input_ids.shape
    return head is not None and rows * cols * int(head.weight.shape[0]) * 4 > chunk_bytes


@contextlib.contextmanager
def hidden_states_out(model: PreTrainedModel) -> Iterator[torch.nn.Linear]:
    """Inside the block, the model's forward returns its last hidden states where the logits
    were (its output layer passes its input through); yields that layer. The layer's weights
    stay where the forward put them (an FSDP2 root keeps its parameters gathered until the
    backward), so a chunk computed after the forward trains them as the forward would."""
    head = output_layer(model)
    if head is None:
        raise ValueError(f"{type(model).__name__}: its logits are not its output layer's output")
    head.forward = _identity  # type: ignore[method-assign,assignment]
    try:
        yield head
    finally:
        del head.forward  # back to the class's forward


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def over_vocab_chunks(
    model: PreTrainedModel,
    batch: SequenceBatch,
    fn: TokenFn,
    extras: Sequence[torch.Tensor] = (),
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[torch.Tensor, ...]:
    """`fn` at every counted completion position, over chunks of positions whose float32 logits
    fit `chunk_bytes`; its outputs scattered back to [B, C, ...] (0 at uncounted positions).

    `extras` are [B, C, ...] tensors `fn` also gets, at the chunk's positions (a teacher's
    top-k ids, its logits). Each chunk runs under a non-reentrant checkpoint: its logits are
    freed after the forward and recomputed, one chunk at a time, in the backward. A batch with
    no counted position still returns outputs connected to the model's graph (a sharded rank's
    placeholder pass must backpropagate like the others)."""
    batch = batch.to(model.device)
    with hidden_states_out(model) as head:
        hidden = _completion_outputs(model, batch)  # [B, C, H]
    where = torch.nonzero(batch.completion_mask > 0, as_tuple=True)
    h = hidden[where]  # [n, H]: the counted positions only
    ids = batch.completion_ids[where]
    picked = [e.to(model.device)[where] for e in extras]
    rows = max(1, chunk_bytes // (4 * int(head.weight.shape[0])))
    chunks: list[tuple[torch.Tensor, ...]] = []
    for lo in range(0, h.shape[0], rows):
        part = [e[lo : lo + rows] for e in picked]
        grad = torch.is_grad_enabled() and (h.requires_grad or head.weight.requires_grad)
        if grad:
            out = checkpoint(
                _chunk,
                fn,
                head.weight,
                head.bias,
                h[lo : lo + rows],
                ids[lo : lo + rows],
                *part,
                use_reentrant=False,
            )
        else:
            out = _chunk(fn, head.weight, head.bias, h[lo : lo + rows], ids[lo : lo + rows], *part)
        chunks.append(out)
    if not chunks:  # nothing counted: one empty chunk, for the shapes and the graph
        out = _chunk(fn, head.weight, head.bias, h[:0], ids[:0], *[e[:0] for e in picked])
        anchor = hidden.sum() * 0.0 + head.weight.sum() * 0.0
        chunks.append(tuple(o + anchor if o.requires_grad or anchor.requires_grad else o for o in out))
    results = []
    b, c = batch.completion_ids.shape
    for k in range(len(chunks[0])):
        flat = torch.cat([ch[k] for ch in chunks], dim=0)
        full = flat.new_zeros((b, c, *flat.shape[1:]))
        results.append(full.index_put(where, flat))
    return tuple(results)


def _chunk(
    fn: TokenFn,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    h: torch.Tensor,
    ids: torch.Tensor,
    *extras: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    logits = F.linear(h, weight.to(h.dtype), None if bias is None else bias.to(h.dtype)).float()
    return fn(logits, ids, *extras)

"""Decode steps without the Hugging Face forward: a preallocated KV cache and one short loop
per layer, for the decoder stacks whose layers we know (Qwen3, Qwen2, Llama).

Why: on the small models Cascade trains on a CPU, a decode step through `model.forward` is
mostly overhead (mask building, a `DynamicCache` that grows by `torch.cat` every token, SDPA's
masked path for a query of length one). `StaticDecoder` runs the same modules (projections,
norms, MLP, rotary embedding: the model's own, so their weights and options are used as they
are) and does only the attention itself: the new key/value is written in place into a cache
sized `prompt + max_new_tokens` up front, and a query of length one attends with two batched
matmuls and an additive padding mask. Numbers agree with the HF forward to float rounding
(tests compare both, and the learner's log-probs, on every supported architecture).

Both steppers here (`StaticDecoder`, `HFStepper` for any other model) also drop finished rows
(`keep`), so the stragglers of a batch whose completions mostly stopped early decode alone,
and hand out the keys/values of chosen rows (`kv`: what a multi-turn round keeps for the next,
`cascade.engine.prefix_kv`).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")


class Stepper(Protocol):
    def step(self, tokens: Tensor, s: int) -> Tensor:
        """Next-token logits [b, V] after the tokens [b] sampled at step s (one per kept row)."""
        ...

    def keep(self, idx: Tensor) -> None:
        """Keep only rows `idx` (indices into the current rows, ascending)."""
        ...

    def kv(self, idx: Tensor, columns: int) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the keys and values [len(idx), kv_heads, columns, head_dim] of rows `idx`
        (indices into the current rows) in the cache's first `columns` columns (copies)."""
        ...


def supports(model: PreTrainedModel) -> bool:
    """True when `model` is a decoder stack `StaticDecoder` reproduces exactly."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False
    if getattr(cfg, "use_sliding_window", False) or int(getattr(cfg, "pretraining_tp", 1) or 1) != 1:
        return False
    inner = getattr(model, "model", None)
    names = ("layers", "norm", "rotary_emb", "embed_tokens")
    return hasattr(model, "lm_head") and all(hasattr(inner, n) for n in names)


class StaticDecoder:
    """Decode B rows that all sit at the same cache column after a (left-padded) prefill.

    `cache` is the HF prefill of the distinct prompts (consumed: its tensors are released), row
    i of the batch takes prefill row `rows[i]`; `attn` [B, P] is the batch's prompt attention
    mask, `next_pos` [B] each row's first completion position. The cache holds P + steps
    columns per layer: keys [B, kv_heads, head_dim, columns] (transposed: the score matmul
    then reads a prefix of the last dimension, several times faster on a CPU than slicing and
    transposing [.., columns, head_dim]) and values [B, kv_heads, columns, head_dim].
    """

    def __init__(
        self,
        model: PreTrainedModel,
        cache: DynamicCache,
        rows: Tensor,
        attn: Tensor,
        next_pos: Tensor,
        steps: int,
    ) -> None:
        cfg = model.config
        self.model = model
        self.inner = model.model
        self.layers = list(self.inner.layers)  # type: ignore[union-attr,arg-type]
        attn0 = self.layers[0].self_attn
        self.head_dim = int(attn0.head_dim)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.group = self.heads // self.kv_heads
        self.scaling = float(attn0.scaling)
        batch, self.prompt_len = attn.shape
        columns = self.prompt_len + steps
        dtype, device = model.lm_head.weight.dtype, attn.device  # type: ignore[union-attr]
        self.keys_t: list[Tensor] = []
        self.values: list[Tensor] = []
        for layer in cache.layers:
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            assert isinstance(k, Tensor) and isinstance(v, Tensor)  # [B_prefill, kv_heads, P, head_dim]
            kt = torch.empty((batch, self.kv_heads, self.head_dim, columns), dtype=dtype, device=device)
            vs = torch.empty((batch, self.kv_heads, columns, self.head_dim), dtype=dtype, device=device)
            kt[..., : self.prompt_len].copy_(k.index_select(0, rows).transpose(-1, -2))
            vs[:, :, : self.prompt_len].copy_(v.index_select(0, rows))
            self.keys_t.append(kt)
            self.values.append(vs)
        cache.layers.clear()
        step_pos = next_pos.unsqueeze(1) + torch.arange(steps, device=device)  # [B, steps]
        probe = torch.empty(0, dtype=dtype, device=device)
        self.cos, self.sin = self.inner.rotary_emb(probe, step_pos)  # type: ignore[union-attr,operator]
        self.bias = torch.zeros((batch, columns), dtype=dtype, device=device)  # 0 or -inf per key
        self.bias[:, : self.prompt_len].masked_fill_(attn == 0, float("-inf"))

    def kv(self, idx: Tensor, columns: int) -> list[tuple[Tensor, Tensor]]:
        return [
            (k.index_select(0, idx)[..., :columns].transpose(-1, -2), v.index_select(0, idx)[:, :, :columns])
            for k, v in zip(self.keys_t, self.values, strict=True)
        ]

    def keep(self, idx: Tensor) -> None:
        self.keys_t = [k.index_select(0, idx) for k in self.keys_t]
        self.values = [v.index_select(0, idx) for v in self.values]
        self.cos, self.sin = self.cos.index_select(0, idx), self.sin.index_select(0, idx)
        self.bias = self.bias.index_select(0, idx)

    def step(self, tokens: Tensor, s: int) -> Tensor:
        b, d, col = tokens.shape[0], self.head_dim, self.prompt_len + s
        cos, sin = self.cos[:, s].unsqueeze(1), self.sin[:, s].unsqueeze(1)  # [b, 1, D]
        mask = self.bias[:, : col + 1].view(b, 1, 1, col + 1)
        x = self.inner.embed_tokens(tokens)  # type: ignore[union-attr,operator]  # [b, hidden]
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, self.heads, d)
            k = attn.k_proj(h).view(b, self.kv_heads, d)
            v = attn.v_proj(h).view(b, self.kv_heads, d)
            if getattr(attn, "q_norm", None) is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.keys_t[li][..., col] = k
            self.values[li][:, :, col] = v
            qg = (q * self.scaling).view(b, self.kv_heads, self.group, d)  # a kv head's queries adjacent
            scores = torch.matmul(qg, self.keys_t[li][..., : col + 1]) + mask  # [b, kv, g, L]
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(weights, self.values[li][:, :, : col + 1]).reshape(b, self.heads * d)
            x = x + attn.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(self.inner.norm(x))  # type: ignore[union-attr,operator,no-any-return]


class HFStepper:
    """The same steps through `model.forward` with the prefill's `DynamicCache` (any model)."""

    def __init__(
        self,
        model: PreTrainedModel,
        cache: DynamicCache,
        rows: Tensor,
        attn: Tensor,
        next_pos: Tensor,
        steps: int,
    ) -> None:
        self.model = model
        self.cache = cache
        cache.batch_select_indices(rows)
        self.prompt_len = attn.shape[1]
        ones = torch.ones((attn.shape[0], steps), dtype=attn.dtype, device=attn.device)
        self.mask = torch.cat([attn, ones], dim=1)
        self.next_pos = next_pos

    def kv(self, idx: Tensor, columns: int) -> list[tuple[Tensor, Tensor]]:
        out = []
        for layer in self.cache.layers:
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            assert isinstance(k, Tensor) and isinstance(v, Tensor)
            out.append((k.index_select(0, idx)[:, :, :columns], v.index_select(0, idx)[:, :, :columns]))
        return out

    def keep(self, idx: Tensor) -> None:
        self.cache.batch_select_indices(idx)
        self.mask = self.mask.index_select(0, idx)
        self.next_pos = self.next_pos.index_select(0, idx)

    def step(self, tokens: Tensor, s: int) -> Tensor:
        out = self.model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=self.mask[:, : self.prompt_len + s + 1],
            position_ids=(self.next_pos + s).unsqueeze(-1),
            cache=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1, :]  # type: ignore[no-any-return]


def stepper(
    model: PreTrainedModel, cache: DynamicCache, rows: Tensor, attn: Tensor, next_pos: Tensor, steps: int
) -> Stepper:
    """`StaticDecoder` where `supports(model)`, `HFStepper` otherwise."""
    cls = StaticDecoder if supports(model) else HFStepper
    return cls(model, cache, rows, attn, next_pos, max(steps, 1))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

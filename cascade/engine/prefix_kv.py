"""A bounded cache of one sequence's keys/values by token-id prefix, and a prefill that reuses it.

Why: a multi-turn rollout (`cascade.tools.turn_loop`) asks the engine for an episode's whole
context every round, and that context extends the previous round's (prompt + generated turn +
the environment's ids). `prefill` looks up the longest cached prefix of the requested ids and
runs the forward only on the rest, on top of the cached keys/values; the result is stored back,
so the next round finds it.

Not yet wired into `cascade.engine.hf.generate`: doing that needs the batched, left-padded
prefill to take rows whose cached prefixes differ in length, and the embedded and distributed
paths to take the same reuse decisions (their tokens are compared `==`); until then single-turn
and multi-turn generation are exactly as before.

Invalidation: an entry records the weights it was computed with (the model's identity and the
sum of its parameters' in-place version counters, which every optimizer step and
`load_state_dict` bump), so after any weight change a lookup misses and the entries are dropped;
`clear()` is there for callers that switch weights another way.

Bound: keys/values cost `2 * layers * kv_heads * head_dim * dtype_bytes` per token (a few KiB
to MiB per token on real models), so an unbounded cache over a run's episodes would grow without
limit; entries are evicted least recently used once their bytes pass `max_bytes`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

DEFAULT_MAX_BYTES = 256 * 2**20


def weights_stamp(model: PreTrainedModel) -> tuple[int, int]:
    """Changes whenever the model's weights change in place (or the model is another object)."""
    return id(model), sum(p._version for p in model.parameters())


@dataclass
class _Entry:
    keys: list[Tensor]  # per layer [1, kv_heads, L, head_dim]
    values: list[Tensor]
    logits: Tensor  # [V] next-token logits after the last id
    nbytes: int


class PrefixKV:
    """LRU by bytes of (ids -> keys/values) for one model's current weights."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._stamp: tuple[int, int] | None = None
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _check(self, model: PreTrainedModel) -> None:
        stamp = weights_stamp(model)
        if stamp != self._stamp:
            self.clear()
            self._stamp = stamp

    def longest(self, model: PreTrainedModel, ids: list[int]) -> tuple[int, _Entry | None]:
        """The longest cached prefix of `ids` (length, entry) for the model's current weights."""
        self._check(model)
        best: tuple[int, ...] | None = None
        for key in self._entries:
            longer = best is None or len(key) > len(best)
            if longer and len(key) <= len(ids) and tuple(ids[: len(key)]) == key:
                best = key
        if best is None:
            return 0, None
        self._entries.move_to_end(best)
        return len(best), self._entries[best]

    def put(self, model: PreTrainedModel, ids: list[int], entry: _Entry) -> None:
        self._check(model)
        key = tuple(ids)
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        if entry.nbytes > self.max_bytes:
            return
        self._entries[key] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            _, gone = self._entries.popitem(last=False)
            self.nbytes -= gone.nbytes


@torch.no_grad()
def prefill(model: PreTrainedModel, ids: list[int], cache: PrefixKV) -> tuple[Tensor, DynamicCache, int]:
    """Next-token logits [V] after `ids`, the sequence's `DynamicCache`, and how many ids came
    from the cache (0: a full prefill). The result is stored in `cache`."""
    if not ids:
        raise ValueError("ids must not be empty")
    reused, entry = cache.longest(model, ids)
    if entry is not None and reused == len(ids):
        cache.hits += 1
        kv = DynamicCache()
        for li, (k, v) in enumerate(zip(entry.keys, entry.values, strict=True)):
            kv.update(k.clone(), v.clone(), li)
        return entry.logits.clone(), kv, reused
    kv = DynamicCache()
    if entry is not None:
        cache.hits += 1
        for li, (k, v) in enumerate(zip(entry.keys, entry.values, strict=True)):
            kv.update(k.clone(), v.clone(), li)
    else:
        cache.misses += 1
    device = model.device
    new = torch.tensor([ids[reused:]], dtype=torch.long, device=device)
    pos = torch.arange(reused, len(ids), device=device).unsqueeze(0)
    mask = torch.ones((1, len(ids)), dtype=torch.long, device=device)
    out = model(input_ids=new, attention_mask=mask, position_ids=pos, cache=kv, use_cache=True)
    logits = out.logits[0, -1].float()
    keys = [layer.keys.clone() for layer in kv.layers]  # type: ignore[union-attr]
    values = [layer.values.clone() for layer in kv.layers]  # type: ignore[union-attr]
    nbytes = sum(t.numel() * t.element_size() for t in keys + values) + logits.numel() * 4
    cache.put(model, ids, _Entry(keys, values, logits.clone(), nbytes))
    return logits, kv, reused

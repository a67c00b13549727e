"""Keys/values kept between the rounds of a multi-turn rollout, and the rule that decides reuse.

Why: the turn loop (`cascade.tools.turn_loop`) asks the engine for each live episode's whole
context every round, and that context extends the previous round's: the context the engine
prefilled, the turn it generated, and the environment's ids. With reuse, round r prefills only
what the engine has not processed (the previous turn's last token, sampled but never fed, and
the environment's ids) on top of the keys/values it kept from round r - 1 (the context's
prefill and the turn's decode steps), batched over the round's episodes
(`cascade.engine.hf.generate_kv`: each row's kept keys/values left-padded to the longest, its
new ids left-padded after them, positions per row). Batched, it is faster than the full
prefill at every length measured, down to 8 kept ids (`bench/turn_kv_reuse.py`), so every
later round reuses: no threshold.

The decision is a function of the request and the round, never of what else the engine served:
the embedded run (`cascade.rollout.policy.PolicyGenerate`) and the distributed one (rollout workers ->
the rollout service's `HFEngine`) compare `==` on a seed, and reuse and a full prefill agree
only to float rounding (tested to 1e-5). So a request names its round (`TurnStep`, set by the
turn loop) and round r >= 1 reuses iff the engine holds that rollout at round r - 1, computed
with the current weights, with every episode the request continues, each kept context a prefix
of its new one: all rows or none. Otherwise the round is computed exactly as it was before reuse
existed (a full prefill, bit for bit), and its keys/values are kept for the next round. Both
paths run this code with the same default bound, and a rollout's state is only ever removed by
its caller's next rollout, a weight change or the bound, so in the normal course both hit on
every later round. Where the distributed run can miss and the embedded one not: the round went
to another replica (the replica pools send a rollout's rounds to the replica that served its
previous round, so only when that one failed or fell behind), the service restarted, the
weights changed between rounds (the rollout then mixes versions anyway), or the service's bound
could not hold every concurrent caller's rollout (`TurnKV`). A miss is still a correct round, on
the full prefill's numbers: the log-probs agree with reuse to float rounding, not bit for bit, so
the two runs are then no longer `==`.

Not a content cache (the longest cached prefix of any request, least recently used first): its
hits would depend on what else the engine served and evicted, so the runs would drift apart.
Round 0, and every request without a `TurnStep`, computes exactly what it did without reuse; the
engine only copies out the keys/values it computed.

Invalidation: a kept rollout records the weights it was computed with (the engine's policy
version, the model's identity and the sum of its parameters' in-place version counters, which
every optimizer step and `load_state_dict` bump): after any weight change its next round
misses, and `clear()` drops everything (`HFEngine` calls it at each weight switch).

Lifetime: an engine holds one rollout per caller (`TurnStep.caller`: host, process, thread;
one caller's rounds never overlap), and the caller's next rollout replaces it at its round 0,
so a finished rollout is let go without a call of its own; the last one stays until then, or
until the bound evicts it.

Bound: keys/values cost `2 * layers * kv_heads * head_dim * dtype_bytes` per token, per episode
(a few KiB on the tiny models, ~150 KiB on an 8B model in bfloat16), so `TurnKV` holds at most
`max_bytes`: after a round it evicts other callers' rollouts, least recently used first, and a
rollout that alone does not fit is not kept (its next round prefills in full, in both paths
alike). `max_bytes=0` turns reuse off.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from torch import Tensor
from transformers import PreTrainedModel

from cascade.engine.base import TurnStep

DEFAULT_MAX_BYTES = 1 << 30


def weights_stamp(model: PreTrainedModel) -> tuple[int, int]:
    """Changes whenever the model's weights change in place (or the model is another object)."""
    return id(model), sum(p._version for p in model.parameters())


@dataclass
class RowKV:
    """One episode's keys/values: every token of `ids` has been through the model."""

    ids: tuple[int, ...]
    keys: list[Tensor]
    """Per layer [kv_heads, len(ids), head_dim], at positions 0..len(ids) - 1."""
    values: list[Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class _Rollout:
    rollout: str
    round: int
    stamp: Hashable
    rows: dict[int, RowKV]
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(r.nbytes for r in self.rows.values())


class TurnKV:
    """Per caller, the keys/values of its current rollout's last round; bounded by bytes.

    Thread-safe: the rollout service runs several requests at once (one caller's rounds never
    overlap: its turn loop waits for each)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._held: OrderedDict[str, _Rollout] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.reused = 0
        """Rounds r >= 1 that reused their episodes' keys/values."""
        self.full = 0
        """Rounds r >= 1 that prefilled their whole contexts (a miss)."""
        self.listeners: list[Callable[[bool], None]] = []
        """Called after each round r >= 1's decision (True: reused), e.g. to count it."""

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self.nbytes = 0

    def take(self, turn: TurnStep, stamp: Hashable, contexts: Sequence[Sequence[int]]) -> list[RowKV] | None:
        """Round r >= 1: the kept keys/values of each context's episode when every one is held
        for this rollout's round r - 1 with weights `stamp` and is a strict prefix of its
        context; else None (the round prefills in full). The caller's state is handed over
        either way: the round's `keep` replaces it."""
        with self._lock:
            held = self._pop(turn.caller)
            rows = None if held is None else _matching(held, turn, stamp, contexts)
            if rows is None:
                self.full += 1
            else:
                self.reused += 1
        for listener in self.listeners:
            listener(rows is not None)
        return rows

    def keep(self, turn: TurnStep, stamp: Hashable, rows: Sequence[RowKV | None]) -> None:
        """After a round: `rows[i]` is the round's row i (episode `turn.episodes[i]`, or i in
        round 0), None where it is not kept (a completion cut by the budget ends its episode)."""
        episodes = turn.episodes if turn.round > 0 else tuple(range(len(rows)))
        state = _Rollout(
            turn.rollout,
            turn.round,
            stamp,
            {e: r for e, r in zip(episodes, rows, strict=True) if r is not None},
        )
        with self._lock:
            self._pop(turn.caller)
            if not self.enabled or state.nbytes > self.max_bytes:
                return
            self._held[turn.caller] = state
            self.nbytes += state.nbytes
            while self.nbytes > self.max_bytes:
                self._pop(next(iter(self._held)))

    def _pop(self, caller: str) -> _Rollout | None:
        held = self._held.pop(caller, None)
        if held is not None:
            self.nbytes -= held.nbytes
        return held


def _matching(
    held: _Rollout, turn: TurnStep, stamp: Hashable, contexts: Sequence[Sequence[int]]
) -> list[RowKV] | None:
    if held.rollout != turn.rollout or held.round != turn.round - 1 or held.stamp != stamp:
        return None
    out = []
    for episode, context in zip(turn.episodes, contexts, strict=True):
        row = held.rows.get(episode)
        if row is None or len(row.ids) >= len(context) or tuple(context[: len(row.ids)]) != row.ids:
            return None
        out.append(row)
    return out

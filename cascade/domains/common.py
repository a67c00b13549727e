"""Helpers shared by the synthetic domains: split assignment, deterministic generation, caching.

Every synthetic generator draws candidate problems from its own seeded RNG and keeps those
whose prompt hashes into the requested split, so the splits are disjoint by construction
(a prompt has exactly one split, whatever the seed) and each split is deterministic in
`(split, n, seed)`.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from cascade.domains.base import Problem

SPLITS = ("train", "eval", "sft")

Candidate = tuple[str, str, dict[str, Any]]
"""(prompt, reference answer, meta) drawn by a domain's generator."""


def split_of(prompt: str) -> str:
    """The split a prompt belongs to: sha256 % 8 == 0 -> eval, 1..3 -> sft, else train."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") % 8
    if bucket == 0:
        return "eval"
    if bucket <= 3:
        return "sft"
    return "train"


def generate_problems(
    domain: str,
    split: str,
    n: int,
    seed: int,
    draw: Callable[[random.Random], Candidate],
    max_draws: int | None = None,
) -> list[Problem]:
    """`n` unique problems of `split`, drawn with `random.Random(f"{domain}-{split}-{seed}")`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{domain}-{split}-{seed}")
    limit = max_draws if max_draws is not None else 200 * n + 10_000
    seen: set[str] = set()
    problems: list[Problem] = []
    draws = 0
    while len(problems) < n:
        if draws >= limit:
            raise ValueError(
                f"{domain}: found only {len(problems)} unique {split!r} problems after {draws} draws "
                f"(asked for {n}); the generator's space is too small"
            )
        draws += 1
        prompt, answer, meta = draw(rng)
        if prompt in seen or split_of(prompt) != split:
            continue
        seen.add(prompt)
        problems.append(
            Problem(
                id=f"{domain}-{split}-{len(problems)}", domain=domain, prompt=prompt, answer=answer, meta=meta
            )
        )
    return problems


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """A small thread-safe least-recently-used map."""

    def __init__(self, maxsize: int = 4096) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

"""Where the front scores its light domains: in its own worker processes, never in its threads.

A verifier is Python holding the GIL (regexes, parsers, sympy); run in a gRPC thread it would
stall every other RPC of the front, health checks included, for as long as one hostile
completion keeps it busy. So the front hands each item to a `WorkerPool` process
(`--local-workers`, default one per core up to 8), where it is scored in that process's main
thread (math's SIGALRM deadline works there), and only waits on pipes itself.

Per item: a worker that runs past the item's timeout (math: its `timeout_s` plus a grace;
other domains: `--item-timeout-s`) is killed and the item gets `timeout` with the domain's
lowest reward (the completion kept the verifier busy: a verdict on it). A worker that dies is
`infra_error`. Items not scored when the RPC's deadline passes are `infra_error` whose detail
starts with `DEADLINE_PASSED` (the service's failure, not the completion's), and the workers
still on them are killed, so they serve the next request at once. Concurrent RPCs share the
workers fairly (`WorkerPool`): six slow items of one client do not queue another's two.

`InProcess` scores in the calling thread instead (`--local-workers 0`; tests of the servicer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from cascade.config import MathReward, PythonReward
from cascade.domains import RewardVerdict
from cascade.domains.base import TIMEOUT
from cascade.domains.length_bound import floor_reward
from cascade.domains.worker_pool import Outcome, WorkerPool
from services.reward.batch import (
    Batch,
    DomainCache,
    batch_from_payload,
    indexed,
    infra_verdicts,
    verdicts_from_json,
    verdicts_to_json,
)

log = logging.getLogger(__name__)

Indexed = Iterator[tuple[int, RewardVerdict]]

DEADLINE_PASSED = "the request's deadline passed before this item was scored"
"""How the detail of an item left unscored at the RPC's deadline starts (metrics count them)."""

PRELOAD = (
    "services.reward.local",
    "cascade.domains.math",
    "math_verify",
    "cascade.domains.instruct",
    "cascade.domains.swe",
)
"""Imported once in the fork server, so a replaced worker is ready at once."""

MATH_GRACE_S = 2.0
"""What a math item's worker may take over the math reward's own `timeout_s`."""


class LocalScoring(Protocol):
    def stream(self, batch: Batch, *, deadline: float | None, is_active: Callable[[], bool]) -> Indexed:
        """Verdicts of `batch` as they are known; stops when `is_active()` is false."""
        ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- in a pool process

_domains: DomainCache | None = None


def _cache() -> DomainCache:
    global _domains
    if _domains is None:
        _domains = DomainCache()
    return _domains


def warm_process() -> None:
    """A pool process's start: import the light verifiers (sympy takes ~1 s) before any item."""
    from cascade.domains import instruct, swe  # noqa: F401
    from cascade.domains.math import _warm_worker

    _cache()
    _warm_worker()


def score_items(domain_json: str, items: list[dict[str, Any]]) -> list[list[Any]]:
    """[reward, reason, detail] per item (in a pool process; the Celery task's twin)."""
    try:
        batch = batch_from_payload(domain_json, items)
    except (ValueError, KeyError, TypeError) as err:
        return verdicts_to_json(infra_verdicts(len(items), f"malformed payload: {err!r:.200}"))
    return verdicts_to_json(_cache().score(batch))


# --------------------------------------------------------------------------- in the front


class PooledScoring:
    def __init__(self, workers: int, *, item_timeout_s: float = 30.0, start_timeout_s: float = 120.0) -> None:
        self.item_timeout_s = item_timeout_s
        self.pool = WorkerPool(
            workers,
            initializer=warm_process,
            start_timeout_s=start_timeout_s,
            name="cascade-reward-local",
            preload=PRELOAD,
        )

    def start(self) -> None:
        self.pool.start()

    def close(self) -> None:
        self.pool.close()

    def timeout_s(self, batch: Batch) -> float:
        """How long one item's worker may run."""
        reward = batch.domain.reward
        if isinstance(reward, PythonReward):  # its own limit, enforced here by killing the process
            return reward.time_limit_s + MATH_GRACE_S
        if batch.domain.kind != "math":
            return self.item_timeout_s
        return (reward if isinstance(reward, MathReward) else MathReward()).timeout_s + MATH_GRACE_S

    def stream(self, batch: Batch, *, deadline: float | None, is_active: Callable[[], bool]) -> Indexed:
        parts = batch.chunks(1)  # one item per task (a batch-wide domain: the whole batch)
        tasks = [(batch.domain_json, batch.payload(indices)) for indices in parts]
        timeout_s = self.timeout_s(batch)
        run = self.pool.run(score_items, tasks, timeout_s=timeout_s, deadline=deadline, is_active=is_active)
        for k, outcome in run:
            if outcome.kind == "cancelled":  # nobody is listening any more
                return
            yield from indexed(parts[k], _verdicts(batch, outcome, len(parts[k]), timeout_s))


def _verdicts(batch: Batch, outcome: Outcome, n: int, timeout_s: float) -> list[RewardVerdict]:
    name = batch.domain.name
    if outcome.kind == "ok":
        try:
            return verdicts_from_json(outcome.value, n)
        except ValueError as err:
            return infra_verdicts(n, f"bad verdicts from a scoring process: {err}")
    if outcome.kind == "timeout" and n == 1 and batch.domain.kind == "python":  # the user's function's
        return infra_verdicts(1, f"the reward function took over {timeout_s:g}s (stopped)")
    if outcome.kind == "timeout" and n == 1:  # this completion kept its verifier busy
        return [
            RewardVerdict(
                floor_reward(batch.domain.kind), TIMEOUT, f"scoring took over {timeout_s:g}s (stopped)"
            )
        ]
    if outcome.kind == "expired":
        return infra_verdicts(n, DEADLINE_PASSED)
    log.warning("%s: %d items unscored: %s %s", name, n, outcome.kind, outcome.detail)
    return infra_verdicts(n, f"{name} scoring process: {outcome.kind}: {outcome.detail}")


class InProcess:
    """Scores in the calling thread (no isolation: a slow verifier holds the GIL)."""

    def __init__(self, domains: DomainCache, chunk_size: int = 8) -> None:
        self.domains = domains
        self.chunk_size = chunk_size

    def close(self) -> None:
        self.domains.close()

    def stream(self, batch: Batch, *, deadline: float | None, is_active: Callable[[], bool]) -> Indexed:
        chunks = batch.chunks(self.chunk_size)
        for k, indices in enumerate(chunks):
            if not is_active():
                return
            if deadline is not None and time.monotonic() >= deadline:
                for rest in chunks[k:]:
                    yield from indexed(rest, infra_verdicts(len(rest), DEADLINE_PASSED))
                return
            part = Batch(
                batch.domain,
                batch.problems[indices.start : indices.stop],
                batch.completions[indices.start : indices.stop],
            )
            yield from indexed(indices, self.domains.score(part))

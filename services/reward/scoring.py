"""Where a batch is scored: in the front's worker processes (light domains, `local`) or by the
Celery workers (heavy ones).

`Dispatcher.stream` yields `(index, verdict)` as chunks finish; `Dispatcher.score` collects
them in order. Infra policy: when the broker or result backend cannot be reached, a task
fails, or a chunk is not back within `task_timeout_s` (or by the client's deadline), its items
come back as `infra_error` verdicts (reward 0.0 that is not a score; the learner drops or
retries them), but for those its worker has already published (`tasks.PROGRESS`): a finished
item keeps its verdict whatever its neighbours do. The RPC itself still succeeds, so one dead
chunk does not discard the rest of the batch.

Each item has its own time budget on the workers (`DispatchConfig.item_budget_s`, see
`budget`): one over it is `timeout`, never `infra_error`. Tasks are queued with priorities
(`priority`), so a client's first items pass another client's backlog.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult

from cascade.domains import RewardVerdict
from cascade.domains.base import INFRA_ERROR
from services.reward.batch import Batch, indexed, infra_verdicts, verdicts_from_json
from services.reward.local import DEADLINE_PASSED, LocalScoring
from services.reward.tasks import PRIORITY_LEVELS, PROGRESS, TASK_NAME

log = logging.getLogger(__name__)

Indexed = Iterator[tuple[int, RewardVerdict]]


_GET_STEP_S = 1.2
"""A little more than the step in which Celery's Redis result consumer waits."""


def _always() -> bool:
    return True


@dataclass(frozen=True)
class DispatchConfig:
    remote_domains: frozenset[str] = frozenset({"code", "rlhf"})
    """Domains scored by the Celery workers; the others are scored by the front (`local`)."""
    remote_when_heavy: frozenset[str] = frozenset({"swe", "agent"})
    """Domains scored by the workers too when their reward config says it is heavy (`heavy`:
    swe's execution mode runs the sandbox, its judge a model; agent's python tool the sandbox)."""
    chunk_size: int = 1
    """Items per Celery task (the local processes take one item at a time). One: each item is
    a task of its own, so a slow item holds one worker process, never its neighbours."""
    task_timeout_s: float = 300.0
    """How long the front waits for a batch's tasks before marking the rest `infra_error`."""
    item_budget_s: float | None = 30.0
    """What one item may take on a Celery worker (an agent episode: all its tool calls) before
    it is stopped and judged `timeout` (see `budget`); None: no budget."""


class Dispatcher:
    def __init__(self, config: DispatchConfig, celery_app: Celery, local: LocalScoring) -> None:
        self.config = config
        self.celery_app = celery_app
        self.local = local

    def score(
        self, batch: Batch, *, is_active: Callable[[], bool] = _always, timeout_s: float | None = None
    ) -> list[RewardVerdict]:
        verdicts: list[RewardVerdict | None] = [None] * len(batch.problems)
        for i, verdict in self.stream(batch, is_active=is_active, timeout_s=timeout_s):
            verdicts[i] = verdict
        return [v or RewardVerdict(0.0, INFRA_ERROR, "not scored") for v in verdicts]

    def stream(
        self, batch: Batch, *, is_active: Callable[[], bool] = _always, timeout_s: float | None = None
    ) -> Indexed:
        """Verdicts as they are known; stops early once `is_active()` is false (client gone).

        `timeout_s` (at most the configured `task_timeout_s` for the Celery workers) is what is
        left before the client's deadline: items not scored by then are `infra_error` verdicts
        whose detail starts with `DEADLINE_PASSED`.
        """
        if batch.domain.kind in self.config.remote_domains or self._heavy(batch):
            limit = (
                self.config.task_timeout_s
                if timeout_s is None
                else min(timeout_s, self.config.task_timeout_s)
            )
            rpc_deadline = timeout_s is not None and timeout_s < self.config.task_timeout_s
            yield from self._remote(batch, is_active, limit, rpc_deadline)
        else:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            yield from self.local.stream(batch, deadline=deadline, is_active=is_active)

    def _heavy(self, batch: Batch) -> bool:
        reward = batch.domain.reward
        if batch.domain.kind not in self.config.remote_when_heavy:
            return False
        if reward is None:  # the domain's defaults: swe's default mode executes
            return batch.domain.kind == "swe"
        return bool(getattr(reward, "heavy", False))

    def _remote(
        self, batch: Batch, is_active: Callable[[], bool], timeout_s: float, rpc_deadline: bool
    ) -> Indexed:
        deadline = time.monotonic() + timeout_s
        pending: dict[range, AsyncResult] = {}
        queue_error = ""
        for k, indices in enumerate(batch.chunks(self.config.chunk_size)):
            if not queue_error:
                try:
                    args = [batch.domain_json, batch.payload(indices), self.config.item_budget_s]
                    pending[indices] = self.celery_app.send_task(TASK_NAME, args=args, priority=priority(k))
                    continue
                except Exception as err:  # broker or result store unreachable: stop trying
                    log.warning("cannot queue a %s task: %r", batch.domain.name, err)
                    queue_error = f"reward queue unavailable: {err!r:.200}"
            yield from indexed(indices, infra_verdicts(len(indices), queue_error))
        while pending and is_active():
            ready = []
            try:
                ready = [indices for indices, result in pending.items() if result.ready()]
            except Exception as err:  # result backend unreachable: nothing more will come back
                log.warning("result backend failed: %r", err)
                for indices in list(pending):
                    del pending[indices]
                    yield from indexed(indices, infra_verdicts(len(indices), f"result backend: {err!r:.200}"))
                return
            for indices in ready:
                yield from indexed(indices, _collect(pending.pop(indices), len(indices)))
            left = deadline - time.monotonic()
            if pending and left <= 0:
                for indices, result in list(pending.items()):
                    del pending[indices]
                    detail = f"no reward worker finished this item within {timeout_s:.3g}s"
                    if rpc_deadline:
                        detail = f"{DEADLINE_PASSED} ({detail})"
                    known = _progress(result, len(indices))
                    _forget(result)
                    for k, i in enumerate(indices):
                        yield i, known.get(k) or RewardVerdict(0.0, INFRA_ERROR, detail)
            elif pending and not ready:
                _wait_a_little(next(iter(pending.values())), left)


def priority(k: int) -> int:
    """The priority of a request's `k`-th task (0 first; see `tasks.PRIORITY_LEVELS`): 0 for
    its first, 1 for its second, 2 for the next two, 3 for the four after... A request's
    first tasks thus pass the backlog of a bigger one queued before it (round robin, by
    powers of two), so a client's few easy items wait for a worker process to finish its
    current item, not for another client's whole batch."""
    return min(PRIORITY_LEVELS - 1, k.bit_length())


def _progress(result: AsyncResult, n: int) -> dict[int, RewardVerdict]:
    """The verdicts a task still running has published (`tasks.PROGRESS`), by its item index."""
    try:
        if result.state != PROGRESS or not isinstance(result.info, dict):
            return {}
        known = result.info.get("verdicts", {})
        return {
            int(k): RewardVerdict(float(r), str(reason), str(detail))
            for k, (r, reason, detail) in known.items()
            if 0 <= int(k) < n
        }
    except Exception as err:  # the result store, or a malformed state: nothing is known
        log.debug("cannot read the progress of task %s: %r", result.id, err)
        return {}


def _wait_a_little(result: AsyncResult, left: float) -> None:
    """Wait for `result`, or about a second, or until `left` seconds are up.

    Waiting through `get` reads the result store's pub/sub messages (which would otherwise
    pile up) and marks the other finished chunks ready too; but Celery then waits in steps
    of one second whatever its timeout, so near the deadline we poll instead.
    """
    if left <= _GET_STEP_S:
        time.sleep(min(0.05, left))
        return
    try:
        result.get(timeout=0.01, propagate=False)
    except CeleryTimeout:
        pass
    except Exception:  # the next `ready()` reports a broken backend
        time.sleep(0.05)


def _collect(result: AsyncResult, n: int) -> list[RewardVerdict]:
    try:
        if not result.successful():
            return infra_verdicts(n, f"reward task {result.state}: {result.result!r:.200}")
        return verdicts_from_json(result.result, n)
    except Exception as err:
        return infra_verdicts(n, f"bad reward task result: {err!r:.200}")
    finally:
        _forget(result)


def _forget(result: AsyncResult) -> None:
    try:
        result.forget()
    except Exception:
        log.debug("could not forget task %s", result.id, exc_info=True)

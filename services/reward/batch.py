"""A validated scoring batch, how it is cut into Celery tasks, and the domains that score it.

Shared by the gRPC front (which scores the light domains itself) and the Celery workers, so
both build domains and turn verifier failures into `infra_error` verdicts the same way.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cascade.config import DomainConfig, parse_domain_config
from cascade.domains import Domain, Problem, RewardVerdict, make_domain
from cascade.domains.base import INFRA_ERROR

log = logging.getLogger(__name__)

UNSPLITTABLE = frozenset({"rlhf"})
"""Domains whose verdicts depend on the whole batch (rlhf: group shaping and the no-answer
floor are per batch), so a batch of them is scored by one task, never cut into chunks."""


@dataclass(frozen=True)
class Batch:
    domain: DomainConfig
    problems: list[Problem]
    completions: list[str]

    @property
    def domain_json(self) -> str:
        """The domain's name and reward config as canonical JSON (task payload, cache key)."""
        return domain_key(self.domain)

    def chunks(self, size: int) -> list[range]:
        """Index ranges of at most `size` items (the whole batch for unsplittable domains)."""
        n = len(self.problems)
        if self.domain.kind in UNSPLITTABLE:
            return [range(0, n)]
        return [range(start, min(start + size, n)) for start in range(0, n, size)]

    def payload(self, indices: range) -> list[dict[str, Any]]:
        """Items `indices` as JSON-serialisable dicts (what a Celery task receives)."""
        return [
            {
                "id": self.problems[i].id,
                "prompt": self.problems[i].prompt,
                "answer": self.problems[i].answer,
                "meta": self.problems[i].meta,
                "completion": self.completions[i],
            }
            for i in indices
        ]


def domain_key(domain: DomainConfig) -> str:
    """Only the reward fields the client set (and `kind`): a validator may read which were set
    (swe refuses `semantic_weight` outside its `similarity` mode), so the workers must parse
    what the client sent, not every default spelled out."""
    reward = domain.reward
    data = {
        "name": domain.name,
        "reward": None
        if reward is None
        else {**reward.model_dump(mode="json", exclude_unset=True), "kind": reward.kind},
    }
    return json.dumps(data, sort_keys=True)


def batch_from_payload(domain_json: str, items: Sequence[dict[str, Any]]) -> Batch:
    """The inverse of `Batch.payload` (on the worker); raises ValueError on a malformed payload."""
    domain = parse_domain_config(json.loads(domain_json), "task domain")
    problems = [
        Problem(id=it["id"], domain=domain.name, prompt=it["prompt"], answer=it["answer"], meta=it["meta"])
        for it in items
    ]
    return Batch(domain, problems, [it["completion"] for it in items])


def infra_verdicts(n: int, detail: str) -> list[RewardVerdict]:
    """`n` verdicts saying the verifier could not score (never a reward the learner trains on)."""
    return [RewardVerdict(0.0, INFRA_ERROR, detail)] * n


class DomainCache:
    """Domains built once per (name, reward config) and reused; the least recently used of more
    than `maxsize` is closed (a math domain holds a worker process)."""

    def __init__(self, maxsize: int = 8) -> None:
        self.maxsize = maxsize
        self._domains: OrderedDict[str, Domain] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, config: DomainConfig) -> Domain:
        key = domain_key(config)
        with self._lock:
            domain = self._domains.get(key)
            if domain is None:
                domain = make_domain(config)
                self._domains[key] = domain
                while len(self._domains) > self.maxsize:
                    _, old = self._domains.popitem(last=False)
                    _close(old)
            self._domains.move_to_end(key)
            return domain

    def close(self) -> None:
        with self._lock:
            while self._domains:
                _close(self._domains.popitem()[1])

    def score(self, batch: Batch) -> list[RewardVerdict]:
        """The batch's verdicts, one per item whatever happens.

        A domain that cannot be built gives `infra_error`s. A domain that raises on the batch
        is asked again item by item (but for `UNSPLITTABLE` ones), so one item that makes it
        raise gets its own `infra_error` and the others their verdicts. (Domains turn what a
        completion controls into verdicts on it themselves; an exception escaping one is the
        platform's failure.)
        Every `infra_error` is logged with its cause.
        """
        n = len(batch.problems)
        try:
            domain = self.get(batch.domain)
        except Exception as err:
            log.exception("cannot build domain %s", batch.domain_json)
            return infra_verdicts(n, f"cannot build the {batch.domain.name} verifier: {err!r:.300}")
        try:
            verdicts = domain.score_batch(batch.problems, batch.completions)
            if len(verdicts) != n:
                raise ValueError(f"verifier returned {len(verdicts)} verdicts for {n} items")
        except Exception as err:
            name = batch.domain.name
            if name in UNSPLITTABLE:  # its verdicts depend on the whole batch: no item alone
                log.exception("%s verifier failed on %d items", name, n)
                return infra_verdicts(n, f"{name} verifier failed: {err!r:.300}")
            log.exception("%s verifier failed on a batch of %d items; scoring them one by one", name, n)
            verdicts = [self._score_one(domain, batch, i) for i in range(n)]
        _log_infra(batch, verdicts)
        return verdicts

    @staticmethod
    def _score_one(domain: Domain, batch: Batch, i: int) -> RewardVerdict:
        try:
            (verdict,) = domain.score_batch([batch.problems[i]], [batch.completions[i]])
            return verdict
        except Exception as err:
            log.exception("%s verifier failed on item %s", batch.domain.name, batch.problems[i].id)
            return RewardVerdict(0.0, INFRA_ERROR, f"{batch.domain.name} verifier failed: {err!r:.300}")


def _log_infra(batch: Batch, verdicts: Sequence[RewardVerdict]) -> None:
    failed = [(p.id, v.detail) for p, v in zip(batch.problems, verdicts, strict=True) if v.is_infra_error]
    if failed:
        log.warning(
            "%s: %d of %d items infra_error; first: %s: %s",
            batch.domain.name,
            len(failed),
            len(verdicts),
            *failed[0],
        )


def _close(domain: Domain) -> None:
    close = getattr(domain, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            log.exception("closing domain %s", getattr(domain, "name", "?"))


def verdicts_to_json(verdicts: Sequence[RewardVerdict]) -> list[list[Any]]:
    return [[v.reward, v.reason, v.detail] for v in verdicts]


def verdicts_from_json(data: Any, n: int) -> list[RewardVerdict]:
    """A task's result back into verdicts; ValueError when it is not `n` [reward, reason, detail]."""
    if not isinstance(data, list) or len(data) != n:
        got = f"{len(data)} verdicts" if isinstance(data, list) else type(data).__name__
        raise ValueError(f"expected {n} verdicts, got {got}")
    return [RewardVerdict(float(r), str(reason), str(detail)) for r, reason, detail in data]


def indexed(indices: range, verdicts: Sequence[RewardVerdict]) -> Iterator[tuple[int, RewardVerdict]]:
    return zip(indices, verdicts, strict=True)

"""Micro-batching of scoring requests: concurrent requests for the same teacher share forwards.

One worker thread owns the model(s): it takes the oldest waiting request and, while other
requests are announced (their RPC has arrived but is still being parsed), waits up to
`max_wait_s` for them, until `max_batch_sequences` sequences for the same teacher are waiting;
then it scores them together with `cascade.distill.scoring.score_sequences`, in forwards of at
most `max_batch_tokens` padded tokens and `max_batch_sequences` sequences, with at most
`logits_chunk_bytes` of float32 logits at a time: the service's memory, whatever the requests.
A lone request never waits. A request with a bad sequence (a sequence longer than
`max_batch_tokens` included), or whose reply would pass the message limit, fails alone, before
anything is computed; the others in its batch are scored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

from cascade.distill.modes import distill_mode
from cascade.distill.samples import SequenceScores
from cascade.distill.scoring import ScoreRequest, check_score_request, score_sequences
from cascade.engine.base import EngineRequestError
from cascade.engine.microbatch import MIB, MicroBatching
from cascade.transport.grpc_server import DEFAULT_MAX_MESSAGE_BYTES
from services.teacher.pool import TeacherPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scored:
    checkpoint: str
    vocab_size: int
    scores: list[SequenceScores]


@dataclass
class _Job:
    teacher: str
    request: ScoreRequest
    future: Future[Scored]

    @property
    def size(self) -> int:
        return len(self.request.completion_ids)


BatchHook = Callable[[str, int, int], None]
"""Called after each forward batch with (teacher, requests, sequences)."""


class ScoringBatcher:
    def __init__(
        self,
        pool: TeacherPool,
        *,
        max_batch_sequences: int = 64,
        max_batch_tokens: int | None = 32768,
        logits_chunk_bytes: int = 256 * MIB,
        max_reply_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_wait_s: float = 0.005,
        on_batch: BatchHook | None = None,
    ) -> None:
        self.pool = pool
        self.max_batch_sequences = max_batch_sequences
        self.batching = MicroBatching(
            tokens=max_batch_tokens, sequences=max_batch_sequences, logits_chunk_bytes=logits_chunk_bytes
        )
        self.max_reply_bytes = max_reply_bytes
        self.max_wait_s = max_wait_s
        self.on_batch = on_batch
        self._jobs: list[_Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._announced = 0
        self._thread = threading.Thread(target=self._run, name="teacher-batcher", daemon=True)
        self._thread.start()

    @contextmanager
    def announce(self) -> Iterator[None]:
        """Wrap an RPC's parsing and `submit`: batches wait for announced requests only."""
        with self._cond:
            self._announced += 1
        try:
            yield
        finally:
            with self._cond:
                self._announced -= 1
                self._cond.notify_all()

    def submit(self, teacher: str, request: ScoreRequest) -> Future[Scored]:
        future: Future[Scored] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("scoring batcher is closed")
            self._jobs.append(_Job(teacher, request, future))
            self._cond.notify_all()
        return future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _take(self) -> list[_Job] | None:
        """The next batch: the oldest job plus later jobs for the same teacher."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                for job in self._jobs:
                    job.future.set_exception(RuntimeError("teacher service stopping"))
                self._jobs.clear()
                return None
            teacher = self._jobs[0].teacher
            deadline = time.monotonic() + self.max_wait_s
            while True:
                waiting = sum(j.size for j in self._jobs if j.teacher == teacher)
                left = deadline - time.monotonic()
                if waiting >= self.max_batch_sequences or left <= 0 or self._closed or not self._announced:
                    break
                self._cond.wait(timeout=left)
            batch: list[_Job] = []
            size = 0
            for job in list(self._jobs):
                if job.teacher != teacher:
                    continue
                if batch and size + job.size > self.max_batch_sequences:
                    break
                batch.append(job)
                size += job.size
                self._jobs.remove(job)
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            try:
                self._score(batch)
            except BaseException as err:  # never leave a caller waiting
                log.error("scoring batch failed", exc_info=err)
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(err)

    def _score(self, batch: list[_Job]) -> None:
        teacher = self.pool.get(batch[0].teacher)
        valid: list[_Job] = []
        for job in batch:
            try:
                check_score_request(
                    job.request, vocab_size=teacher.vocab_size, max_context=teacher.max_context
                )
                self._check_bounds(job.request, teacher.vocab_size)
            except EngineRequestError as err:
                job.future.set_exception(err)
                continue
            valid.append(job)
        if not valid:
            return
        results = score_sequences(
            teacher.model, [j.request for j in valid], pad_id=teacher.pad_id, batching=self.batching
        )
        if self.on_batch is not None:
            self.on_batch(teacher.name, len(valid), sum(j.size for j in valid))
        for job, scores in zip(valid, results, strict=True):
            job.future.set_result(Scored(teacher.path, teacher.vocab_size, scores))

    def _check_bounds(self, request: ScoreRequest, vocab_size: int) -> None:
        """What the service's own bounds refuse: a sequence no forward within `max_batch_tokens`
        can hold, a reply over the message limit (known before anything is computed)."""
        limit = self.batching.tokens
        pairs = zip(request.prompt_ids, request.completion_ids, strict=True)
        for i, (prompt, completion) in enumerate(pairs):
            if limit is not None and len(prompt) + len(completion) > limit:
                raise EngineRequestError(
                    f"sequences[{i}]: {len(prompt)} + {len(completion)} tokens exceed the teacher "
                    f"service's --max-batch-tokens of {limit} (the tokens of one forward)"
                )
        tokens = sum(len(c) for c in request.completion_ids)
        too_big = distill_mode(request.mode).reply_size_error(tokens, vocab_size, self.max_reply_bytes)
        if too_big is not None:
            raise EngineRequestError(too_big)

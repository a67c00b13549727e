"""The sources of the distributed run: the other services.

- `StreamRollouts`: an RL batch's requests go to the run's `prompts` stream; rollout workers
  (`services/rollout/worker.py`) take them through a consumer group, call the same
  `generate_and_score` as the embedded run with the rollout and reward services behind it, and
  publish `ScoredChunk`s to the `groups` stream. Each request of a batch is taken once (by its
  index: a re-delivery after a worker died, or the first answer of a re-issued request, is
  dropped), and only chunks of this learner process's `attempt`.
  Unscored generation (eval, distillation students) and weight updates go straight to the
  rollout replicas (`services.learner.replicas`): every replica in service holds the learner's
  current weights after every step, and all count versions alike (one offset).
- `ServiceTeachers`: teacher log-probs from the teacher service; new best checkpoints are
  registered with it (`SetTeacher`), and again after a restart.

Blips (`cascade.resilience`, bounded by `resilience.*_s`): Redis calls are retried through the
`redis` dependency; a Redis that comes back without the run's streams (restarted without
persistence) has them made again and every request not back yet re-issued. While the learner
waits for a batch it probes the rollout replicas every `HEAL_EVERY_S` (a restarted one gets the
current weights again; see `services.learner.replicas`). Teacher calls are retried through the
`teacher` dependency, and a teacher service that has forgotten the registered teachers
(restarted) gets them again before the call is retried.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import redis
import torch

from cascade.config import DistillConfig
from cascade.distill.modes import distill_mode
from cascade.distill.samples import DistillSamples, TeacherTokens
from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.engine.batch import SequenceBatch
from cascade.model.loading import Policy
from cascade.resilience import Dependency
from cascade.rollout.requests import PromptRequest, ScoredChunk
from cascade.runner.checkpoint import save_model_dir
from cascade.runner.sources import SourceStopped
from cascade.transport.channel import ServiceUnavailable, outage_aware
from cascade.transport.redis_streams import TRANSIENT, StreamGroup, StreamKeys, connect, publish, reset
from cascade.transport.teacher_client import TeacherClient, TeacherReply
from services.learner.replicas import RolloutReplicas

WAIT_NOTE_S = 30.0
HEAL_EVERY_S = 2.0
LOST_AFTER_S = 5.0
"""A request of the batch waited on that a worker has finished (taken and acknowledged) while its
answer has not come back for this long is published again: its answer was taken by another
reader of the results stream (a learner that was taken over and has not noticed yet). An
answer that still arrives is dropped as a duplicate."""
"""While waiting for a batch: how often the rollout replicas are probed (`RolloutReplicas.heal`)."""


class StreamRollouts:
    """Rollouts from the workers over Redis streams, weights to every rollout replica."""

    kind = "distributed"
    overlaps = True

    def __init__(
        self,
        *,
        redis_url: str,
        stream_prefix: str,
        rollout: RolloutReplicas,
        weights_root: Path,
        keep_weights: int = 2,
        log: Callable[[str], None] = print,
        redis_outage: Dependency | None = None,
    ) -> None:
        """`redis_outage`: the `redis` dependency (default: no retry). Its outages reach the step
        metrics through the store's watched dependencies (`services.learner.learner`)."""
        self.redis = connect(redis_url)
        self.redis_outage = redis_outage or Dependency(
            "redis", give_up_after_s=0.0, transient=TRANSIENT, log=log
        )
        self.keys = StreamKeys(stream_prefix)
        self.rollout = rollout
        self.weights_root = weights_root
        self.keep_weights = keep_weights
        self.log = log
        self._requests: dict[int, list[PromptRequest]] = {}
        self._message_ids: dict[int, dict[int, str]] = {}  # batch -> request index -> message id
        self._chunks: dict[int, dict[int, ScoredChunk]] = {}
        self._attempt = ""
        self._duplicates = 0
        self._reissued = 0
        self._results: StreamGroup | None = None
        self._resets_seen = 0
        self._reread_pending = False
        self._answered_at: dict[int, dict[int, float]] = {}
        """batch -> request index -> when a worker was first seen to have answered it (the
        answer not back yet)."""
        self._stop_if: Callable[[], bool] = lambda: False

    # ------------------------------------------------------------------ life cycle

    def attach(self, policy: Policy, generator: torch.Generator, version: Callable[[], int]) -> None:
        """Start clean on this run's keys (a previous process's requests and chunks go), and
        map the learner's versions onto the replicas' (which only grow; one offset for all)."""

        def start_clean() -> StreamGroup:
            reset(self.redis, self.keys)
            StreamGroup(self.redis, self.keys.prompts, "rollout", "learner")  # the workers' group, made here
            return StreamGroup(self.redis, self.keys.groups, "learner", "learner")

        self._results = self.redis_outage.call(start_clean)
        self.rollout.attach(version())

    def record(self) -> dict[str, Any]:
        return {"stream_prefix": self.keys.prefix}

    def forget(self, previous: dict[str, Any]) -> None:
        prefix = previous.get("stream_prefix")
        if prefix and prefix != self.keys.prefix:
            self.redis_outage.call(lambda: reset(self.redis, StreamKeys(prefix)))
            self.log(f"discarded the Redis streams of the previous process ({prefix}:*)")

    def finish(self) -> None:
        self.redis_outage.call(lambda: reset(self.redis, self.keys))

    def close(self) -> None:
        self.rollout.close()
        self.redis.close()

    @property
    def version_offset(self) -> int:
        return self.rollout.offset

    # ------------------------------------------------------------------ weights

    def push(self, policy: Policy, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        self.weights_root.mkdir(parents=True, exist_ok=True)
        path = (self.weights_root / f"v{version:06d}").resolve()
        save_model_dir(policy, path)
        t_saved = time.perf_counter()
        pushed = self.rollout.push(str(path), version)
        for old in sorted(self.weights_root.iterdir())[: -self.keep_weights]:
            shutil.rmtree(old, ignore_errors=True)
        return {**pushed, "time_save_weights_s": t_saved - t0, "time_push_s": time.perf_counter() - t0}

    # ------------------------------------------------------------------ RL batches

    def submit(self, requests: list[PromptRequest]) -> None:
        batch = requests[0].batch
        self._attempt = requests[0].attempt
        self._requests[batch] = requests
        self._chunks[batch] = {}
        self._message_ids[batch] = {}
        self._answered_at[batch] = {}
        for req in requests:
            self._message_ids[batch][req.index] = self.redis_outage.call(partial(self._publish, req))

    def _publish(self, req: PromptRequest) -> str:
        data = req.to_json()
        data["policy_version"] += self.version_offset  # as every replica counts
        return publish(self.redis, self.keys.prompts, data)

    def collect(self, batch: int) -> list[ScoredChunk]:
        wanted = len(self._requests[batch])
        note = time.perf_counter() + WAIT_NOTE_S
        heal = time.perf_counter() + HEAL_EVERY_S
        while len(self._chunks[batch]) < wanted:
            if self._stop_if():
                raise SourceStopped(f"stopped waiting for batch {batch}: this learner's lease was taken over")
            self.redis_outage.call(lambda: self._drain(block_ms=100))
            assert self._results is not None
            if self._results.resets != self._resets_seen:
                self._restore()
            if time.perf_counter() > heal:
                heal = time.perf_counter() + HEAL_EVERY_S
                self.rollout.heal()
                self._reissue_lost(batch)
            if time.perf_counter() > note:
                note += WAIT_NOTE_S
                self.log(f"  waiting for batch {batch}: {len(self._chunks[batch])}/{wanted} requests back")
        chunks = list(self._chunks.pop(batch).values())
        for c in chunks:
            c.engine_version -= self.version_offset
        del self._requests[batch]
        self._message_ids.pop(batch, None)
        self._answered_at.pop(batch, None)
        return chunks

    def stop_when(self, check: Callable[[], bool]) -> None:
        self._stop_if = check

    def _reissue_lost(self, batch: int) -> None:
        """Publish again the requests of `batch` whose answers are lost (`LOST_AFTER_S`)."""
        missing = [r for r in self._requests[batch] if r.index not in self._chunks[batch]]
        if not missing:
            return
        done = self.redis_outage.call(lambda: self._finished_by_workers(batch, missing))
        now = time.monotonic()
        lost = []
        for req in missing:
            if req.index not in done:
                self._answered_at[batch].pop(req.index, None)
            elif now - self._answered_at[batch].setdefault(req.index, now) > LOST_AFTER_S:
                lost.append(req)
        for req in lost:
            self._message_ids[batch][req.index] = self.redis_outage.call(partial(self._publish, req))
            self._answered_at[batch].pop(req.index, None)
        if lost:
            self._reissued += len(lost)
            self.log(
                f"  re-issued {len(lost)} requests of batch {batch}: a worker answered them, "
                f"the answers did not come back in {LOST_AFTER_S:g}s"
            )

    def _finished_by_workers(self, batch: int, requests: list[PromptRequest]) -> set[int]:
        """The indices of `requests` a worker took and acknowledged (it published its answer);
        none while the streams are being made again (a Redis restart)."""
        try:
            groups = self.redis.xinfo_groups(self.keys.prompts)
        except redis.ResponseError:  # no such key: Redis lost the streams, `_restore` re-issues
            return set()
        last = next((g["last-delivered-id"] for g in groups if _text(g["name"]) == "rollout"), None)
        if last is None:
            return set()
        done = set()
        for req in requests:
            mid = self._message_ids[batch].get(req.index)
            if mid is None or _stream_id(mid) > _stream_id(_text(last)):
                continue  # not delivered to any worker yet
            if not self.redis.xpending_range(self.keys.prompts, "rollout", min=mid, max=mid, count=1):
                done.add(req.index)
        return done

    def _drain(self, block_ms: int) -> None:
        """Take what the workers published: each request once, this attempt's batches only.
        After a failed call, the chunks read but not acknowledged are read again first."""
        assert self._results is not None, "attach() first"
        pending, self._reread_pending = self._reread_pending, True  # until this drain completes
        for message in self._results.read(count=64, block_ms=block_ms, pending=pending):
            chunk = ScoredChunk.from_json(message.data)
            wanted = self._chunks.get(chunk.batch)
            if chunk.attempt != self._attempt:  # made for a learner process that is gone
                self.log(f"  dropped a chunk of another attempt ({chunk.attempt}): batch {chunk.batch}")
            elif wanted is None or chunk.index in wanted:
                self._duplicates += 1  # re-delivered, re-issued and answered twice, or taken back
                self.log(f"  dropped a duplicate chunk: batch {chunk.batch} request {chunk.index}")
            else:
                wanted[chunk.index] = chunk
            self._results.ack(message.id)
        self._reread_pending = False

    def _restore(self) -> None:
        """Redis lost the run's streams (restarted without persistence): make them and their
        groups again and re-issue every request of the batches in flight that is not back; an
        answer to the lost request that still arrives is dropped as a duplicate."""
        assert self._results is not None
        self._resets_seen = self._results.resets

        def reissue() -> int:
            StreamGroup(self.redis, self.keys.prompts, "rollout", "learner")
            StreamGroup(self.redis, self.keys.groups, "learner", "learner")
            n = 0
            for batch, requests in self._requests.items():
                for req in requests:
                    if req.index not in self._chunks[batch]:
                        self._message_ids[batch][req.index] = self._publish(req)
                        self._answered_at.get(batch, {}).pop(req.index, None)
                        n += 1
            return n

        n = self.redis_outage.call(reissue)
        self._reissued += n
        self.log(
            f"  Redis lost the run's streams (restarted without persistence?): made them again and "
            f"re-issued {n} request(s) not back yet"
        )

    def discard(self, batches: list[int]) -> None:
        """Requests not generated yet are taken back from the workers (acked and deleted);
        chunks that arrive for them later are dropped (not asked for)."""
        ids = [mid for b in batches for mid in self._message_ids.pop(b, {}).values()]
        if ids:

            def take_back() -> None:
                self.redis.xack(self.keys.prompts, "rollout", *ids)
                self.redis.xdel(self.keys.prompts, *ids)

            self.redis_outage.call(take_back)
        for b in batches:
            self._requests.pop(b, None)
            self._chunks.pop(b, None)
            self._answered_at.pop(b, None)

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        result = self.rollout.generate(prompts, n, sampling)
        result.version -= self.version_offset
        return result

    def stats(self) -> dict[str, float]:
        out = {"duplicate_chunks": float(self._duplicates), "reissued_requests": float(self._reissued)}
        self._duplicates = self._reissued = 0
        return out


class ServiceTeachers:
    """Teacher log-probs from the teacher service; every registration is remembered, so a
    restarted service that answers "unknown teacher" is given them all again."""

    in_learner = False

    def __init__(
        self,
        address: str,
        *,
        vocab_size: int,
        log: Callable[[str], None] = print,
        outage: Dependency | None = None,
    ) -> None:
        """`outage`: the `teacher` dependency (default: no retry)."""
        self.client = TeacherClient(address)
        self.vocab_size = vocab_size
        self.log = log
        self.outage = outage or Dependency(
            "teacher", give_up_after_s=0.0, transient=(ServiceUnavailable,), log=log
        )
        self.registered: dict[str, str] = {}
        self.reregistered = 0
        """Times the service had forgotten the teachers and was given them again."""
        self._lock = threading.Lock()

    def register(self, domain: str, path: Path) -> None:
        with self._lock:
            self.registered[domain] = str(path)
        self.outage.call(lambda: self._rpc(lambda: self.client.set_teacher(domain, str(path))))
        self.log(f"  teacher '{domain}' -> {path.name}")

    def _rpc(self, fn: Callable[[], Any]) -> Any:
        return outage_aware("teacher service", fn)

    def _logprobs(self, teacher: str, samples: DistillSamples, **kw: Any) -> TeacherReply:
        def call() -> TeacherReply:
            return self._rpc(
                lambda: self.client.logprobs(teacher, samples.prompt_ids, samples.completion_ids, **kw)
            )

        def attempt() -> TeacherReply:
            try:
                return call()
            except grpc.RpcError as err:
                if not (_unknown_teacher(err) and teacher in self.registered):
                    raise
            self._register_again()
            return call()

        return self.outage.call(attempt)

    def _register_again(self) -> None:
        """The service does not know a teacher it was given: restarted. Give it every one."""
        with self._lock:
            registered = dict(self.registered)
        for domain, path in registered.items():
            self._rpc(partial(self.client.set_teacher, domain, path))
        self.reregistered += 1
        self.log(
            f"  the teacher service had forgotten its teachers (restarted?): registered "
            f"{', '.join(sorted(registered))} again"
        )

    def tokens(
        self, teacher: str, samples: DistillSamples, sb: SequenceBatch, cfg: DistillConfig
    ) -> TeacherTokens:
        mode = distill_mode(cfg.loss)
        replies = [
            self._logprobs(teacher, samples, mode=r.mode, temperature=r.temperature, topk=r.topk).scores
            for r in mode.requests(cfg, self.vocab_size)
        ]
        return mode.remote_tokens(replies, sb)

    def close(self) -> None:
        self.client.close()


def _unknown_teacher(err: grpc.RpcError) -> bool:
    details = err.details() if hasattr(err, "details") else ""
    return err.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown teacher" in (details or "")


class NoTeachers:
    """A cascade that never distils (or `--no-distill`): asking for a teacher is a bug."""

    in_learner = False

    def register(self, domain: str, path: Path) -> None:
        pass

    def tokens(
        self, teacher: str, samples: DistillSamples, sb: SequenceBatch, cfg: DistillConfig
    ) -> TeacherTokens:
        raise RuntimeError(f"no teacher service configured, but teacher '{teacher}' was asked for")

    def close(self) -> None:
        pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _stream_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)

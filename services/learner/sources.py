"""The sources of the distributed run: the other services.

- `StreamRollouts`: an RL batch's requests go to the run's `prompts` stream; rollout workers
  (`services/rollout/worker.py`) take them through a consumer group, call the same
  `generate_and_score` as the embedded run with the rollout and reward services behind it, and
  publish `ScoredChunk`s to the `groups` stream. Each sample id is taken once (a re-delivery
  after a worker died is dropped), and only chunks of this learner process's `attempt`.
  Unscored generation (eval, distillation students) and weight updates go straight to the
  rollout replicas (`services.learner.replicas`): every replica in service holds the learner's
  current weights after every step, and all count versions alike (one offset).
- `ServiceTeachers`: teacher log-probs from the teacher service; new best checkpoints are
  registered with it (`SetTeacher`), and again after a restart.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cascade.checkpoint import save_model_dir
from cascade.config import DistillConfig
from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.engine.batch import SequenceBatch
from cascade.model.loading import Policy
from cascade.rollout import PromptRequest, ScoredChunk
from cascade.trainer import DistillSamples, TeacherTokens, remote_teacher_tokens
from cascade.transport.redis_streams import SeenSet, StreamGroup, StreamKeys, connect, publish, reset
from cascade.transport.teacher_client import TeacherClient
from services.learner.replicas import RolloutReplicas

WAIT_NOTE_S = 30.0


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
    ) -> None:
        self.redis = connect(redis_url)
        self.keys = StreamKeys(stream_prefix)
        self.rollout = rollout
        self.weights_root = weights_root
        self.keep_weights = keep_weights
        self.log = log
        self._requests: dict[int, list[PromptRequest]] = {}
        self._message_ids: dict[int, list[str]] = {}
        self._chunks: dict[int, dict[int, ScoredChunk]] = {}
        self._attempt = ""
        self._duplicates = 0
        self._results: StreamGroup | None = None
        self._seen: SeenSet | None = None

    # ------------------------------------------------------------------ life cycle

    def attach(self, policy: Policy, generator: torch.Generator, version: Callable[[], int]) -> None:
        """Start clean on this run's keys (a previous process's requests and chunks go), and
        map the learner's versions onto the replicas' (which only grow; one offset for all)."""
        reset(self.redis, self.keys)
        StreamGroup(self.redis, self.keys.prompts, "rollout", "learner")  # the workers' group, made here
        self._results = StreamGroup(self.redis, self.keys.groups, "learner", "learner")
        self._seen = SeenSet(self.redis, self.keys.seen)
        self.rollout.attach(version())

    def record(self) -> dict[str, Any]:
        return {"stream_prefix": self.keys.prefix}

    def forget(self, previous: dict[str, Any]) -> None:
        prefix = previous.get("stream_prefix")
        if prefix and prefix != self.keys.prefix:
            reset(self.redis, StreamKeys(prefix))
            self.log(f"discarded the Redis streams of the previous process ({prefix}:*)")

    def finish(self) -> None:
        reset(self.redis, self.keys)

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
        ids = []
        for req in requests:
            data = req.to_json()
            data["policy_version"] += self.version_offset  # as every replica counts
            ids.append(publish(self.redis, self.keys.prompts, data))
        self._message_ids[batch] = ids

    def collect(self, batch: int) -> list[ScoredChunk]:
        wanted = len(self._requests[batch])
        note = time.perf_counter() + WAIT_NOTE_S
        while len(self._chunks[batch]) < wanted:
            self._drain(block_ms=100)
            if time.perf_counter() > note:
                note += WAIT_NOTE_S
                self.log(f"  waiting for batch {batch}: {len(self._chunks[batch])}/{wanted} requests back")
        chunks = list(self._chunks.pop(batch).values())
        for c in chunks:
            c.engine_version -= self.version_offset
        del self._requests[batch]
        self._message_ids.pop(batch, None)
        return chunks

    def _drain(self, block_ms: int) -> None:
        """Take what the workers published: each sample id once, this attempt's batches only."""
        assert self._results is not None and self._seen is not None, "attach() first"
        for message in self._results.read(count=64, block_ms=block_ms):
            chunk = ScoredChunk.from_json(message.data)
            wanted = self._chunks.get(chunk.batch)
            if chunk.attempt != self._attempt:  # made for a learner process that is gone
                self.log(f"  dropped a chunk of another attempt ({chunk.attempt}): batch {chunk.batch}")
            else:
                fresh = self._seen.take([sid for group in chunk.sample_ids for sid in group])
                if not all(fresh) or wanted is None or chunk.index in wanted:
                    self._duplicates += 1  # re-delivered (a worker died after publishing) or taken back
                    self.log(f"  dropped a re-delivered chunk: batch {chunk.batch} request {chunk.index}")
                else:
                    wanted[chunk.index] = chunk
            self._results.ack(message.id)

    def discard(self, batches: list[int]) -> None:
        """Requests not generated yet are taken back from the workers (acked and deleted);
        chunks that arrive for them later are dropped (not asked for)."""
        ids = [mid for b in batches for mid in self._message_ids.pop(b, [])]
        if ids:
            self.redis.xack(self.keys.prompts, "rollout", *ids)
            self.redis.xdel(self.keys.prompts, *ids)
        for b in batches:
            self._requests.pop(b, None)
            self._chunks.pop(b, None)

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        result = self.rollout.generate(prompts, n, sampling)
        result.version -= self.version_offset
        return result

    def stats(self) -> dict[str, float]:
        out = {"duplicate_chunks": float(self._duplicates)}
        self._duplicates = 0
        return out


class ServiceTeachers:
    """Teacher log-probs from the teacher service."""

    def __init__(self, address: str, *, vocab_size: int, log: Callable[[str], None] = print) -> None:
        self.client = TeacherClient(address)
        self.vocab_size = vocab_size
        self.log = log

    def register(self, domain: str, path: Path) -> None:
        self.client.set_teacher(domain, str(path))
        self.log(f"  teacher '{domain}' -> {path.name}")

    def tokens(
        self, teacher: str, samples: DistillSamples, sb: SequenceBatch, cfg: DistillConfig
    ) -> TeacherTokens:
        mode_t = cfg.temperature if cfg.loss == "sampled" else 1.0
        topk = min(cfg.topk, self.vocab_size)
        reply = self.client.logprobs(
            teacher, samples.prompt_ids, samples.completion_ids, mode=cfg.loss, temperature=mode_t, topk=topk
        )
        t1 = None
        if cfg.loss == "topk":
            t1 = self.client.logprobs(
                teacher, samples.prompt_ids, samples.completion_ids, mode="sampled"
            ).scores
        return remote_teacher_tokens(reply.scores, sb, cfg, t1)

    def close(self) -> None:
        self.client.close()


class NoTeachers:
    """A cascade that never distils (or `--no-distill`): asking for a teacher is a bug."""

    def register(self, domain: str, path: Path) -> None:
        pass

    def tokens(
        self, teacher: str, samples: DistillSamples, sb: SequenceBatch, cfg: DistillConfig
    ) -> TeacherTokens:
        raise RuntimeError(f"no teacher service configured, but teacher '{teacher}' was asked for")

    def close(self) -> None:
        pass

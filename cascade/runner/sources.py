"""What the stage loop is given: where rollouts come from, where teacher log-probs come from,
and where new weights go.

The loop (`cascade.runner.loop.CascadeRunner`) is written once against these three interfaces.
`cascade.runner.local` implements them in this process (the embedded run: the policy being
trained generates, frozen teachers score, weights need to go nowhere);
`services.learner.sources` implements them over Redis streams and gRPC (the distributed run:
rollout workers, the teacher service, the rollout service's weight updates).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from cascade.config import DistillConfig
from cascade.distill.samples import DistillSamples, TeacherTokens
from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.engine.batch import SequenceBatch
from cascade.model.loading import Policy
from cascade.rollout.requests import PromptRequest, ScoredChunk


class SourceStopped(Exception):
    """A wait for rollouts ended because the loop's `stop_when` check said so (its lease was
    taken over): nothing more is taken from the streams the new holder reads."""


class RolloutSource(Protocol):
    kind: str
    """The run's kind as the store records it: `embedded` or `distributed`."""

    overlaps: bool
    """True when generation runs elsewhere: the loop then fetches distillation data in a thread
    while the RL batch is out, and seeds every request (no shared generator across processes)."""

    def attach(self, policy: Policy, generator: torch.Generator, version: Callable[[], int]) -> None:
        """Called once the policy is loaded (fresh or from a checkpoint), before any request;
        `version()` is the learner's policy version at any moment."""

    def submit(self, requests: list[PromptRequest]) -> None:
        """Start generating and scoring one RL batch's requests."""

    def collect(self, batch: int) -> list[ScoredChunk]:
        """Block until every request of `batch` is back; its chunks, each taken once."""

    def stop_when(self, check: Callable[[], bool]) -> None:
        """From now on, a wait in `collect` ends with `SourceStopped` as soon as `check()` is
        true (the runner's lease lost): a runner taken over takes nothing more of the run's
        results, which are the new holder's."""

    def discard(self, batches: list[int]) -> None:
        """Take back requests not collected (stage over, pause): nothing is generated for them."""

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        """Unscored completions of the current policy (eval, distillation students)."""

    def stats(self) -> dict[str, float]:
        """Step metrics of the source since the last call (e.g. re-delivered chunks dropped)."""

    def record(self) -> dict[str, Any]:
        """What the run directory records to resume this source (no secrets)."""

    def forget(self, previous: dict[str, Any]) -> None:
        """Discard what a previous process of this run left behind (its `record()`)."""

    def finish(self) -> None:
        """The run is over (completed, aborted or failed): remove what it keeps outside this
        process (the distributed run's Redis streams)."""

    def close(self) -> None: ...


class TeacherSource(Protocol):
    in_learner: bool
    """Whether the teachers' weights are held in the learner's memory (its step-memory check
    counts them)."""

    def register(self, domain: str, path: Path) -> None:
        """`domain`'s best checkpoint is now `path` (also called on resume for every teacher)."""

    def tokens(
        self, teacher: str, samples: DistillSamples, sb: SequenceBatch, cfg: DistillConfig
    ) -> TeacherTokens:
        """The teacher's view of the student's completions, as the distillation loss needs it."""

    def close(self) -> None: ...


class WeightSink(Protocol):
    def push(self, policy: Policy, version: int) -> dict[str, float]:
        """Make `version` of the policy the one that generates; returns timing metrics."""

    def close(self) -> None: ...


@dataclass
class RunSources:
    rollouts: RolloutSource
    teachers: TeacherSource
    weights: WeightSink
    also_close: list[Callable[[], None]] = field(default_factory=list)
    """What else the run holds open for its sources (e.g. the reward service's channel that the
    distributed learner's eval verifiers share)."""

    def close(self) -> None:
        self.rollouts.close()
        self.teachers.close()
        self.weights.close()
        for close in self.also_close:
            close()

"""What a step's rollout is made of: the generation request, the scored chunk a request comes
back as, the step's batch merged from its chunks, and the one seed rule for every request.

These cross the prompts and chunks streams as JSON, so the embedded run and a rollout worker build
and read the same objects.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from cascade.algo.turn_mask import TurnLayout
from cascade.domains.base import Problem, RewardVerdict
from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.tools.environment import EpisodeStats

GenerateFn = Callable[[list[list[int]], int, SamplingSettings], VersionedGeneration]
"""`(prompt token ids, completions per prompt, sampling) -> completions, prompt-major`: the
policy in this process (`PolicyGenerate`) or the rollout service (`RolloutClient`)."""

ScoreFn = Callable[[str, list[Problem], list[str], dict[str, Any] | None], list[RewardVerdict]]
"""`(domain, problems, completions, reward config) -> verdicts`: the domain objects in this
process or the reward service."""


@dataclass
class RolloutBatch:
    """G completions for each of N problems; sequence i belongs to group i // G."""

    domain: str
    problems: list[Problem]
    group_size: int
    prompt_ids: list[list[int]]  # [N*G]
    completion_ids: list[list[int]]  # [N*G]
    logprobs: list[list[float]]  # [N*G], behaviour-policy log-probs from the engine
    finish_reasons: list[str]  # [N*G]
    texts: list[str]  # [N*G]
    verdicts: list[RewardVerdict]  # [N*G]
    policy_version: int
    temperature: float
    sample_ids: list[str] = field(default_factory=list)  # [N*G], as the requests named them
    layouts: list[TurnLayout] = field(default_factory=list)
    """[N*G] which completion tokens are the model's (multi-turn); empty: all of them."""
    episodes: list[dict[str, float]] = field(default_factory=list)
    """[N*G] multi-turn: each episode's tool counts (`EpisodeStats.as_metrics()`)."""

    @property
    def n_groups(self) -> int:
        return len(self.problems)

    def rewards(self) -> torch.Tensor:
        """[N, G] rewards; infra errors take the mean of their group's valid rewards."""
        r = torch.tensor([v.reward for v in self.verdicts], dtype=torch.float32).view(self.n_groups, -1)
        valid = self.valid_mask().view(self.n_groups, -1)
        if bool(valid.all()):
            return r
        fill = (r * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1)
        return torch.where(valid, r, fill)

    def valid_mask(self) -> torch.Tensor:
        """[N*G] False for samples whose verifier failed (never trained on as reward 0)."""
        return torch.tensor([not v.is_infra_error for v in self.verdicts])

    def truncated_mask(self) -> torch.Tensor:
        return torch.tensor([r == "length" for r in self.finish_reasons])

    def reason_counts(self) -> dict[str, int]:
        return dict(Counter(v.reason for v in self.verdicts))


@dataclass
class PromptRequest:
    """A few problems of one RL batch: the unit of generation, of work on the prompts stream and
    of re-delivery. `seed` None: sample from the run's one generator (embedded `seeding: stream`)."""

    batch: int  # the learner's RL batch number
    index: int  # this request's position in the batch
    domain: str
    policy_version: int  # the version the learner expects the completions to come from
    seed: int | None
    group_size: int
    max_tokens: int
    temperature: float
    top_p: float
    overlong: str
    problems: list[dict[str, Any]]  # Problem fields
    prompt_ids: list[list[int]]  # one per problem
    sample_ids: list[list[str]]  # [problem][completion]
    reward_config: dict[str, Any] | None = None
    attempt: str = ""
    """The learner process that asked: a chunk made for a dead learner's request is not taken."""
    thinking: bool = False
    """The prompts open a thinking turn: so does every later turn of a multi-turn episode."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PromptRequest:
        return cls(**data)

    def problem_objects(self) -> list[Problem]:
        return [Problem(**p) for p in self.problems]

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed
        )


@dataclass
class ScoredChunk:
    """One request's completions, behaviour log-probs, texts and verdicts, with the version of
    the weights that actually produced them."""

    batch: int
    index: int
    worker: str
    engine_version: int
    sample_ids: list[list[str]]  # [problem][completion]
    completion_ids: list[list[int]]  # [problem * G], prompt-major
    logprobs: list[list[float]]
    finish_reasons: list[str]
    texts: list[str]
    verdicts: list[tuple[float, str, str]]
    timings: dict[str, float] = field(default_factory=dict)
    attempt: str = ""
    layouts: list[list[list[int]]] = field(default_factory=list)
    """Multi-turn: each completion's `TurnLayout` runs as `[n_tokens, is_model]`; empty when
    every completion is the model's alone (`logprobs` are then the engine's, else scattered
    with 0.0 at the environment's tokens)."""
    episodes: list[dict[str, float]] = field(default_factory=list)
    """Multi-turn: each episode's tool counts in the turn loop (`EpisodeStats.as_metrics()`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScoredChunk:
        data = dict(data)
        data["verdicts"] = [tuple(v) for v in data["verdicts"]]
        return cls(**data)


def problem_fields(p: Problem) -> dict[str, Any]:
    return {"id": p.id, "domain": p.domain, "prompt": p.prompt, "answer": p.answer, "meta": p.meta}


def merge_chunks(
    requests: list[PromptRequest], chunks: list[ScoredChunk], *, policy_version: int, temperature: float
) -> RolloutBatch:
    """The RL batch the learner trains on: requests in order, each with its scored chunk."""
    by_index = {c.index: c for c in chunks}
    out = RolloutBatch(
        domain=requests[0].domain,
        problems=[],
        group_size=requests[0].group_size,
        prompt_ids=[],
        completion_ids=[],
        logprobs=[],
        finish_reasons=[],
        texts=[],
        verdicts=[],
        policy_version=policy_version,
        temperature=temperature,
    )
    multi_turn = any(c.layouts for c in chunks)
    for req in sorted(requests, key=lambda r: r.index):
        chunk = by_index[req.index]
        if multi_turn:
            out.layouts.extend(chunk_layouts(chunk))
            out.episodes.extend(chunk.episodes or [EpisodeStats(turns=1).as_metrics()] * len(chunk.texts))
        out.problems.extend(req.problem_objects())
        out.prompt_ids.extend(ids for ids in req.prompt_ids for _ in range(req.group_size))
        out.completion_ids.extend(chunk.completion_ids)
        out.logprobs.extend(chunk.logprobs)
        out.finish_reasons.extend(chunk.finish_reasons)
        out.texts.extend(chunk.texts)
        out.sample_ids.extend(sid for ids in req.sample_ids for sid in ids)
        out.verdicts.extend(RewardVerdict(float(r), reason, detail) for r, reason, detail in chunk.verdicts)
    return out


def chunk_layouts(chunk: ScoredChunk) -> list[TurnLayout]:
    """Each completion's layout (one model run for a single-turn chunk)."""
    if not chunk.layouts:
        return [TurnLayout(((len(ids), True),)) for ids in chunk.completion_ids]
    return [TurnLayout(tuple((int(n), bool(m)) for n, m in runs)) for runs in chunk.layouts]


def request_seed(seed: int, *parts: object) -> int:
    """A 63-bit sampling seed for one generation request, from the run's seed and the request's
    identity (e.g. `"rl", batch number, request index`): the same in every process."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)

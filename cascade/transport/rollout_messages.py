"""What travels on the two Redis streams, as plain JSON-able dataclasses.

- `PromptRequest` (learner -> rollout workers): a few problems of one RL batch, their prompt
  token ids, one sample id per completion to make, the sampling settings and seed, the domain's
  reward config, and the policy version the learner expects them to be generated with.
- `ScoredChunk` (worker -> learner): the same request's completions, behaviour log-probs,
  texts and verdicts, with the policy version the rollout engine actually used.

A request is the unit of work (and of re-delivery); sample ids make taking it idempotent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cascade.domains.base import Problem, RewardVerdict
from cascade.rollout import RolloutBatch


@dataclass
class PromptRequest:
    batch: int  # the learner's RL batch number
    index: int  # this request's position in the batch
    domain: str
    policy_version: int  # engine version the learner expects (a check, not a selector)
    seed: int
    group_size: int
    max_tokens: int
    temperature: float
    top_p: float
    overlong: str
    problems: list[dict[str, Any]]  # Problem fields
    prompt_ids: list[list[int]]  # one per problem
    sample_ids: list[list[str]]  # [problem][completion]
    reward_config: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PromptRequest:
        return cls(**data)

    def problem_objects(self) -> list[Problem]:
        return [Problem(**p) for p in self.problems]


@dataclass
class ScoredChunk:
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScoredChunk:
        data = dict(data)
        data["verdicts"] = [tuple(v) for v in data["verdicts"]]
        return cls(**data)


def problem_fields(p: Problem) -> dict[str, Any]:
    return {"id": p.id, "domain": p.domain, "prompt": p.prompt, "answer": p.answer, "meta": p.meta}


def batch_from_chunks(
    requests: list[PromptRequest], chunks: list[ScoredChunk], *, policy_version: int, temperature: float
) -> RolloutBatch:
    """The RL batch the learner trains on: requests in order, each with its scored chunk."""
    by_index = {c.index: c for c in chunks}
    problems: list[Problem] = []
    prompt_ids: list[list[int]] = []
    out = RolloutBatch(
        domain=requests[0].domain,
        problems=problems,
        group_size=requests[0].group_size,
        prompt_ids=prompt_ids,
        completion_ids=[],
        logprobs=[],
        finish_reasons=[],
        texts=[],
        verdicts=[],
        policy_version=policy_version,
        temperature=temperature,
    )
    for req in sorted(requests, key=lambda r: r.index):
        chunk = by_index[req.index]
        problems.extend(req.problem_objects())
        prompt_ids.extend(ids for ids in req.prompt_ids for _ in range(req.group_size))
        out.completion_ids.extend(chunk.completion_ids)
        out.logprobs.extend(chunk.logprobs)
        out.finish_reasons.extend(chunk.finish_reasons)
        out.texts.extend(chunk.texts)
        out.verdicts.extend(RewardVerdict(float(r), reason, detail) for r, reason, detail in chunk.verdicts)
    return out

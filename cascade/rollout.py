"""The rollout side of a step: generation requests, generate-and-score, the batch merge.

A step's prompts become `PromptRequest`s (`cascade.runner.planning` plans them, one seed rule);
`generate_and_score` turns one request into a `ScoredChunk` with whatever engine and verifier it
is given (the embedded run passes the policy in this process and the domain objects, a rollout
worker passes the rollout and reward services); `merge_chunks` makes the step's `RolloutBatch`
from its requests' chunks. The same three functions serve both modes.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from cascade.algo.turn_mask import TurnLayout
from cascade.config import ChatConfig
from cascade.domains.base import INFRA_ERROR, TRUNCATED, Problem, RewardVerdict
from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.engine.hf import Generation, generate
from cascade.engine.hf_engine import sample_request
from cascade.engine.prefix_kv import DEFAULT_MAX_BYTES, TurnKV, weights_stamp
from cascade.model.chat import encode_prompts
from cascade.model.loading import Policy
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


def generate_and_score(
    req: PromptRequest,
    *,
    generate_fn: GenerateFn,
    decode: Callable[[list[list[int]]], list[str]],
    score: ScoreFn,
    worker: str,
    encode: Callable[[str, bool], list[int]] | None = None,
) -> ScoredChunk:
    """Generate one request's groups, score them, apply the overlong rule: the rollout worker's
    whole job, and the embedded run's rollout of one request. Agent problems are multi-turn
    (`cascade.tools.turn_loop`, which needs `encode`: `(text, literal) -> ids`)."""
    import time

    t0 = time.perf_counter()
    problems = [p for p in req.problem_objects() for _ in range(req.group_size)]
    layouts: list[list[list[int]]] = []
    episode_counts: list[dict[str, float]] = []
    unavailable: list[str | None] = []
    turns = _turn_setup(req, problems)
    if turns is None:
        result = generate_fn(req.prompt_ids, req.group_size, req.sampling())
        gen, version = result.generation, result.version
        texts = decode(gen.completion_ids)
    else:
        if encode is None:
            raise ValueError(f"domain {req.domain}: multi-turn rollouts need an encoder")
        from cascade.tools.turn_loop import run_turns

        seed = req.seed
        episodes = run_turns(
            req.prompt_ids,
            req.group_size,
            req.sampling(),
            generate_fn=generate_fn,
            decode=decode,
            encode=encode,
            environments=turns.environments,
            fmt=turns.format,
            thinking=req.thinking,
            max_turns=turns.max_turns,
            round_seed=lambda r: None if seed is None else request_seed(seed, "turn", r),
            keep_kv=turns.keep_kv,
        )
        gen = Generation(episodes.completion_ids, episodes.logprobs, episodes.finish_reasons)
        version, texts = episodes.version, episodes.texts
        layouts = [[[n, int(m)] for n, m in lay.runs] for lay in episodes.layouts]
        episode_counts = [s.as_metrics() for s in episodes.stats]
        unavailable = episodes.unavailable
    t_gen = time.perf_counter()
    verdicts = apply_overlong(
        score(req.domain, problems, texts, req.reward_config), gen.finish_reasons, req.overlong
    )
    if any(unavailable):  # a tool the infrastructure could not run: never a reward the model earned
        verdicts = [
            RewardVerdict(0.0, INFRA_ERROR, why) if why else v
            for v, why in zip(verdicts, unavailable, strict=True)
        ]
    return ScoredChunk(
        batch=req.batch,
        index=req.index,
        worker=worker,
        engine_version=version,
        sample_ids=req.sample_ids,
        completion_ids=gen.completion_ids,
        logprobs=gen.logprobs,
        finish_reasons=gen.finish_reasons,
        texts=texts,
        verdicts=[(v.reward, v.reason, v.detail) for v in verdicts],
        timings={"generate_s": t_gen - t0, "score_s": time.perf_counter() - t_gen},
        attempt=req.attempt,
        layouts=layouts,
        episodes=episode_counts,
    )


def _turn_setup(req: PromptRequest, problems: list[Problem]) -> Any:
    return multi_turn_setup(req.domain, problems, req.reward_config)


def multi_turn_setup(domain: str, problems: list[Problem], reward_config: dict[str, Any] | None) -> Any:
    """The turn loop's environments and format when `domain`'s problems are multi-turn (the
    agent domain's store tasks, one fresh environment per episode in `problems`), else None:
    one rule for RL requests and distillation samples alike."""
    if domain != "agent":
        return None
    from cascade.domains.agent import turn_setup

    return turn_setup(problems, reward_config)


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


def apply_overlong(
    verdicts: list[RewardVerdict], finish_reasons: list[str], overlong: str
) -> list[RewardVerdict]:
    """`overlong: zero`: a completion cut by the token budget scores 0 (infra errors stay)."""
    if overlong != "zero":
        return verdicts
    return [
        RewardVerdict(0.0, TRUNCATED, "cut by the token budget")
        if fin == "length" and v.reason != INFRA_ERROR
        else v
        for v, fin in zip(verdicts, finish_reasons, strict=True)
    ]


class PolicyGenerate:
    """The policy in this process as a `GenerateFn`, through the HF engine's sampling path
    (`sample_request`): a request with a seed samples from a generator seeded with it (the
    same tokens as the rollout service's HF engine), one without from `generator`. Multi-turn
    rounds keep and reuse their keys/values in `turns` as the HF engine does (the same default
    bound; `cascade.engine.prefix_kv`)."""

    def __init__(
        self,
        policy: Policy,
        *,
        generator: torch.Generator | None = None,
        version: Callable[[], int] = lambda: 0,
        turn_kv_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.policy = policy
        self.generator = generator
        self.version = version
        self.turns = TurnKV(turn_kv_bytes)

    def __call__(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        model, version = self.policy.model, self.version()
        out = sample_request(
            model,
            prompts,
            n,
            sampling,
            eos_ids=self.policy.eos_token_ids,
            pad_id=self.policy.pad_token_id,
            generator=self.generator,
            turns=self.turns,
            stamp=(version, *weights_stamp(model)),
        )
        return VersionedGeneration(generation=out, version=version, n=n)


def sample_completions(
    policy: Policy,
    chat: ChatConfig,
    problems: list[Problem],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    thinking: bool,
    generator: torch.Generator | None,
    greedy: bool = False,
) -> tuple[list[list[int]], Generation]:
    prompt_ids = encode_prompts(policy.tokenizer, chat, [p.prompt for p in problems], thinking)
    repeated = [ids for ids in prompt_ids for _ in range(n)]
    gen = generate(
        policy.model,
        repeated,
        max_new_tokens=max_new_tokens,
        eos_ids=policy.eos_token_ids,
        pad_id=policy.pad_token_id,
        temperature=temperature,
        top_p=top_p,
        greedy=greedy,
        generator=generator,
    )
    return repeated, gen

"""Turn problems into scored groups of completions (the rollout side of a step).

Embedded mode calls this directly; the distributed rollout workers will call the same
function with a remote engine and reward client behind it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cascade.config import ChatConfig
from cascade.domains.base import INFRA_ERROR, TRUNCATED, Domain, Problem, RewardVerdict
from cascade.engine.hf import Generation, generate
from cascade.model.chat import encode_prompts
from cascade.model.loading import Policy


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

    @property
    def n_groups(self) -> int:
        return len(self.problems)

    @property
    def sample_ids(self) -> list[str]:
        return [f"{p.id}/v{self.policy_version}/{j}" for p in self.problems for j in range(self.group_size)]

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

    @staticmethod
    def concat(parts: Sequence[RolloutBatch]) -> RolloutBatch:
        """One batch from requests of the same step (same domain, group size and version)."""
        first = parts[0]
        return RolloutBatch(
            domain=first.domain,
            problems=[p for b in parts for p in b.problems],
            group_size=first.group_size,
            prompt_ids=[x for b in parts for x in b.prompt_ids],
            completion_ids=[x for b in parts for x in b.completion_ids],
            logprobs=[x for b in parts for x in b.logprobs],
            finish_reasons=[x for b in parts for x in b.finish_reasons],
            texts=[x for b in parts for x in b.texts],
            verdicts=[x for b in parts for x in b.verdicts],
            policy_version=min(b.policy_version for b in parts),
            temperature=first.temperature,
        )


def request_seed(seed: int, *parts: object) -> int:
    """A 63-bit sampling seed for one generation request, from the run's seed and the request's
    identity (e.g. `"rl", batch number, request index`): the same in every process."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


def seeded_generator(seed: int, *parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(request_seed(seed, *parts))


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


def collect_groups(
    policy: Policy,
    chat: ChatConfig,
    domain: Domain,
    problems: list[Problem],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    thinking: bool,
    overlong: str,
    policy_version: int,
    generator: torch.Generator | None,
) -> RolloutBatch:
    prompt_ids, gen = sample_completions(
        policy,
        chat,
        problems,
        n=group_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        thinking=thinking,
        generator=generator,
    )
    texts = policy.tokenizer.batch_decode(gen.completion_ids, skip_special_tokens=True)
    repeated_problems = [p for p in problems for _ in range(group_size)]
    verdicts = apply_overlong(domain.score_batch(repeated_problems, texts), gen.finish_reasons, overlong)
    return RolloutBatch(
        domain=domain.name,
        problems=problems,
        group_size=group_size,
        prompt_ids=prompt_ids,
        completion_ids=gen.completion_ids,
        logprobs=gen.logprobs,
        finish_reasons=gen.finish_reasons,
        texts=texts,
        verdicts=verdicts,
        policy_version=policy_version,
        temperature=temperature,
    )

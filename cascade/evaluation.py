"""Greedy eval of every configured domain: the rows of the regression table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cascade.config import ChatConfig
from cascade.domains.base import Domain, Problem, score_for_eval
from cascade.model.loading import Policy
from cascade.rollout import sample_completions


@dataclass
class DomainEval:
    domain: str
    score: float  # mean reward over the eval prompts (accuracy for 0/1 rewards)
    n: int
    reasons: dict[str, int]


def evaluate_domain(
    policy: Policy,
    chat: ChatConfig,
    domain: Domain,
    problems: list[Problem],
    *,
    max_new_tokens: int,
    thinking: bool = False,
    batch_size: int = 256,
) -> DomainEval:
    rewards: list[float] = []
    reasons: Counter[str] = Counter()
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        _, gen = sample_completions(
            policy,
            chat,
            chunk,
            n=1,
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            thinking=thinking,
            generator=None,
            greedy=True,
        )
        texts = policy.tokenizer.batch_decode(gen.completion_ids, skip_special_tokens=True)
        for v in score_for_eval(domain, chunk, texts):
            if v.is_infra_error:
                reasons[v.reason] += 1
                continue
            rewards.append(v.reward)
            reasons[v.reason] += 1
    score = sum(rewards) / len(rewards) if rewards else 0.0
    return DomainEval(domain=domain.name, score=score, n=len(rewards), reasons=dict(reasons))

"""Greedy eval of every configured domain: the rows of the regression table.

The completions come from a `GenerateFn`: the policy in this process (embedded run, SFT) or the
rollout service holding the learner's current weights (distributed run). Same prompts, same
batches, same greedy decoding: the same scores either way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from cascade.config import ChatConfig
from cascade.domains.base import Domain, Problem, score_for_eval
from cascade.engine.base import SamplingSettings
from cascade.model.chat import encode_prompts
from cascade.rollout import GenerateFn


@dataclass
class DomainEval:
    domain: str
    score: float  # mean reward over the eval prompts (accuracy for 0/1 rewards)
    n: int
    reasons: dict[str, int]


def evaluate_domain(
    generate_fn: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
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
    sampling = SamplingSettings(max_tokens=max_new_tokens, greedy=True)
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        prompt_ids = encode_prompts(tokenizer, chat, [p.prompt for p in chunk], thinking)
        gen = generate_fn(prompt_ids, 1, sampling).generation
        texts = tokenizer.batch_decode(gen.completion_ids, skip_special_tokens=True)
        for v in score_for_eval(domain, chunk, texts):
            reasons[v.reason] += 1
            if not v.is_infra_error:
                rewards.append(v.reward)
    score = sum(rewards) / len(rewards) if rewards else 0.0
    return DomainEval(domain=domain.name, score=score, n=len(rewards), reasons=dict(reasons))

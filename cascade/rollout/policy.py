"""The policy in this process as a generator: the embedded run's `GenerateFn` and the plain
sampling the bootstrap builders evaluate with."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cascade.config import ChatConfig
from cascade.domains.base import Problem
from cascade.engine.base import Generation, SamplingSettings, VersionedGeneration
from cascade.engine.hf import generate
from cascade.engine.hf_engine import sample_request
from cascade.engine.prefix_kv import DEFAULT_MAX_BYTES, TurnKV, weights_stamp
from cascade.model.chat import encode_prompts
from cascade.model.loading import Policy


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

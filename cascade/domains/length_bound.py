"""The one bound on how much text a verifier reads, applied before any verifier sees it.

Every verifier reads the final response (the completion after its reasoning block,
`strip_thinking`) with regexes and parsers; a few of them cost more than linear time, and a
policy controls the length. `make_domain` therefore wraps each domain in `LengthBounded`: a
response longer than the domain's `max_response_chars` gets `output_limit` and the domain's
lowest reward (`floor_reward`: 0, or -1 for swe, whose unparsable patches score -1: a long
answer must never pay more than a malformed one), and its text never reaches the verifier.
The reasoning block is not counted: long thinking is not penalised, only a long answer.

rlhf is not wrapped: its reward model reads at most `max_length` tokens of the response
(the tokenizer cuts it), and its raw scores have no floor to give.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from cascade.domains.base import OUTPUT_LIMIT, Domain, Problem, RewardVerdict
from cascade.model.chat import strip_thinking

ScoreFn = Callable[[Sequence[Problem], Sequence[str]], list[RewardVerdict]]

FLOOR_REWARDS = {"swe": -1.0}
"""The lowest reward of a domain whose verdicts go below 0; every other domain's is 0."""


def floor_reward(domain: str) -> float:
    return FLOOR_REWARDS.get(domain, 0.0)


def response_length(completion: str, limit: int) -> int | None:
    """The response's length when it is over `limit`, else None (cheap for short completions)."""
    if len(completion) <= limit:
        return None
    n = len(strip_thinking(completion))
    return n if n > limit else None


class LengthBounded:
    """`inner` with every response over `max_chars` judged `output_limit` before it is read.

    Everything else (`make_problems`, `close`, `prepare`, `config`, ...) is the inner domain's.
    """

    def __init__(self, inner: Domain, max_chars: int) -> None:
        self.inner = inner
        self.max_chars = max_chars
        self.name = inner.name

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return self.inner.make_problems(split, n, seed)

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        return self._bounded(self.inner.score_batch, problems, completions)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        value = getattr(self.inner, name)
        if name == "eval_batch":  # an eval reads the same text: the same bound
            return functools.partial(self._bounded, value)
        return value

    def _bounded(
        self, score: ScoreFn, problems: Sequence[Problem], completions: Sequence[str]
    ) -> list[RewardVerdict]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        verdicts: list[RewardVerdict | None] = [None] * len(completions)
        keep: list[int] = []
        for i, completion in enumerate(completions):
            n = response_length(completion, self.max_chars)
            if n is None:
                keep.append(i)
            else:
                verdicts[i] = over_long_verdict(self.name, n, self.max_chars)
        if keep:
            scored = score([problems[i] for i in keep], [completions[i] for i in keep])
            if len(scored) != len(keep):
                raise ValueError(f"verifier returned {len(scored)} verdicts for {len(keep)} items")
            for i, verdict in zip(keep, scored, strict=True):
                verdicts[i] = verdict
        return [v for v in verdicts if v is not None]


def over_long_verdict(domain: str, length: int, limit: int) -> RewardVerdict:
    return RewardVerdict(
        floor_reward(domain),
        OUTPUT_LIMIT,
        f"{OVER_LONG}: {length} characters after the reasoning block (limit {limit}); not read",
    )


OVER_LONG = "response too long"
"""How an over-long verdict's detail starts (the reward service counts them by it)."""


def bounded(domain: Domain, max_chars: int | None) -> Domain:
    """`domain` behind the bound, or as it is when there is none."""
    return domain if max_chars is None else LengthBounded(domain, max_chars)

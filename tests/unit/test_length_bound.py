"""The response-length bound every domain but rlhf sits behind (`make_domain`): an answer over
the domain's `max_response_chars` is judged `output_limit` at the domain's lowest reward and never
reaches the verifier; the reasoning block does not count."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cascade.config import DomainConfig
from cascade.domains import make_domain
from cascade.domains.base import OK, OUTPUT_LIMIT, EvalScoring, NeedsPreparing, Problem, RewardVerdict
from cascade.domains.length_bound import OVER_LONG, LengthBounded


class Spy:
    """Pays everything and remembers what it read."""

    name = "math"

    def __init__(self) -> None:
        self.read: list[str] = []

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return []

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        self.read += completions
        return [RewardVerdict(1.0, OK, c[:10]) for c in completions]

    def eval_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        return self.score_batch(problems, completions)


P = Problem(id="p", domain="math", prompt="q", answer="1")


def test_an_over_long_answer_is_never_read_and_earns_nothing() -> None:
    spy = Spy()
    domain = LengthBounded(spy, 100)  # type: ignore[arg-type]
    long_thinking = "<think>" + "x" * 10_000 + "</think>short answer"
    texts = ["a" * 100, "b" * 101, long_thinking, "<think>t</think>" + "c" * 101]
    verdicts = domain.score_batch([P] * 4, texts)
    assert [v.reason for v in verdicts] == [OK, OUTPUT_LIMIT, OK, OUTPUT_LIMIT]
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0, 0.0]
    assert verdicts[1].detail.startswith(OVER_LONG) and "101 characters" in verdicts[1].detail
    assert spy.read == [texts[0], texts[2]]  # in order, without the over-long ones
    assert [v.reason for v in domain.eval_batch([P, P], ["a", "b" * 200])] == [OK, OUTPUT_LIMIT]


@pytest.mark.parametrize(
    ("name", "floor", "limit"), [("math", 0.0, 32_000), ("if", 0.0, 32_000), ("swe", -1.0, 64_000)]
)
def test_make_domain_bounds_each_domain_at_its_floor(name: str, floor: float, limit: int) -> None:
    domain = make_domain(DomainConfig.model_validate({"name": name}))
    problem = domain.make_problems("eval", 1, 0)[0]
    (verdict,) = domain.score_batch([problem], ["z" * (limit + 1)])
    assert (verdict.reward, verdict.reason) == (floor, OUTPUT_LIMIT)
    (verdict,) = domain.score_batch([problem], [problem.answer])
    assert verdict.reason == OK


def test_the_bound_is_configured_per_domain() -> None:
    domain = make_domain(
        DomainConfig.model_validate({"name": "if", "reward": {"kind": "if", "max_response_chars": 5}})
    )
    problem = domain.make_problems("eval", 1, 0)[0]
    assert domain.score_batch([problem], ["<think>long reasoning</think>abcdef"])[0].reason == OUTPUT_LIMIT


def test_the_wrapper_is_the_inner_domain_otherwise() -> None:
    math = make_domain(DomainConfig(name="math"))
    assert not isinstance(math, EvalScoring)  # math has no eval_batch: neither does its wrapper
    assert math.make_problems("eval", 2, 0) == make_domain(DomainConfig(name="math")).make_problems(
        "eval", 2, 0
    )
    code = make_domain(DomainConfig(name="code"))
    assert isinstance(code, NeedsPreparing)  # the sandbox check still runs at a stage's start

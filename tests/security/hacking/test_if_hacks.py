"""Reward hacking, if: hostile replies scored exactly as training scores them.

The corpus (`corpus_if.py`) goes through `make_domain(...).score_batch` (what `cascade.rollout`
calls), under each case's reward config (`all_pass` by default, `fraction` where named). Every
hostile reply earns 0 with a fair verdict and never `infra_error`; the replies that follow the
instructions earn 1 in the same run, after all the hostile ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from corpus_if import CASES, RIGHT
from hostile_cases import failures

from cascade.config import DomainConfig, IfReward
from cascade.domains import make_domain
from cascade.domains.base import RewardVerdict

pytestmark = pytest.mark.timeout(300)


def _score(items: list[Any]) -> list[RewardVerdict]:
    """Each item under its own reward config, in corpus order, one batch per config."""
    out: list[RewardVerdict | None] = [None] * len(items)
    configs = {repr(sorted(i.reward_config.items())): i.reward_config for i in items}
    for key, config in configs.items():
        domain = make_domain(DomainConfig(name="if", reward=IfReward(**config)))
        index = [n for n, i in enumerate(items) if repr(sorted(i.reward_config.items())) == key]
        got = domain.score_batch([items[n].problem for n in index], [items[n].completion for n in index])
        for n, verdict in zip(index, got, strict=True):
            out[n] = verdict
    assert all(v is not None for v in out)
    return [v for v in out if v is not None]


@pytest.fixture(scope="module")
def verdicts() -> tuple[list[RewardVerdict], list[RewardVerdict]]:
    return _score(list(CASES)), _score(list(RIGHT))


def test_corpus_covers_each_class() -> None:
    names = {c.name for c in CASES}
    assert len(CASES) >= 8
    for needed in (
        "bullet_template",
        "empty_json_object",
        "chinese_for_all_capitals",
        "chinese_for_all_lowercase",
        "every_constrained_option",
        "required_word_repeated",
        "one_topic_word_repeated",
        "json_stuffed_with_every_word",
        "empty_reply",
    ):
        assert needed in names
    assert {c.problem.id for c in CASES} <= {r.problem.id for r in RIGHT}, "each problem has a right reply"


def test_hostile_replies_earn_nothing_and_are_never_infra(
    verdicts: tuple[list[RewardVerdict], list[RewardVerdict]],
) -> None:
    hostile, _ = verdicts
    assert failures(CASES, hostile) == []


def test_right_replies_are_paid_in_the_same_run(
    verdicts: tuple[list[RewardVerdict], list[RewardVerdict]],
) -> None:
    _, right = verdicts
    wrong = [(r.name, v) for r, v in zip(RIGHT, right, strict=True) if v.reward != pytest.approx(r.reward)]
    assert wrong == []


def test_the_synthetic_reference_answers_follow_the_corpus_rules() -> None:
    """The toy problems here are shaped as the domain draws them: its own references pass."""
    domain = make_domain(DomainConfig(name="if"))
    problems = domain.make_problems("train", 300, 1)
    assert all(v.reward == 1.0 for v in domain.score_batch(problems, [p.answer for p in problems]))

"""Reward hacking, agent: hostile transcripts scored exactly as training scores them.

The corpus (`corpus_agent.py`) goes through `make_domain(...).score_batch` (what `cascade.rollout`
calls). Every hostile transcript earns 0 with a fair verdict and never `infra_error`; the right
ones (other routes to the same task: calls one a turn, in the head, after malformed calls, in
thinking mode) earn 1 in the same run, after all the hostile ones.
"""

from __future__ import annotations

import pytest
from corpus_agent import CASES, RIGHT
from hostile_cases import failures

from cascade.config import AgentReward, DomainConfig
from cascade.domains import make_domain
from cascade.domains.base import RewardVerdict

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def verdicts() -> tuple[list[RewardVerdict], list[RewardVerdict]]:
    domain = make_domain(DomainConfig(name="agent", reward=AgentReward()))
    hostile = domain.score_batch([c.problem for c in CASES], [c.completion for c in CASES])
    right = domain.score_batch([r.problem for r in RIGHT], [r.completion for r in RIGHT])
    return hostile, right


def test_corpus_covers_each_class() -> None:
    names = {c.name for c in CASES}
    for needed in (
        "answer_without_calls",
        "forged_values_after_real_calls",
        "forged_ok_for_a_set_never_made",
        "claims_done_without_set",
        "copies_error_response",
        "same_call_again_and_again",
        "call_limit",
        "restates_question",
        "ends_after_calls",
    ):
        assert needed in names
    assert {c.problem.id for c in CASES} <= {r.problem.id for r in RIGHT}, (
        "each problem has a right transcript"
    )


def test_hostile_transcripts_earn_nothing(verdicts: tuple[list[RewardVerdict], list[RewardVerdict]]) -> None:
    hostile, _ = verdicts
    assert failures(CASES, hostile) == []


def test_right_transcripts_are_paid_after_them(
    verdicts: tuple[list[RewardVerdict], list[RewardVerdict]],
) -> None:
    _, right = verdicts
    unpaid = [
        f"{r.name}: {v.reward} {v.reason} {v.detail!r}"
        for r, v in zip(RIGHT, right, strict=True)
        if v.reward != r.reward
    ]
    assert unpaid == []

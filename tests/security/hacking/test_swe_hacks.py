"""Reward hacking, swe: hostile patches scored exactly as training scores them.

The corpus (`corpus_swe.py`) goes through `make_domain(...).score_batch` (what `cascade.rollout`
calls) with the default `execution` reward: the patch applied to the problem's repository, its
tests run in the bubblewrap sandbox. Every hostile patch earns at most its cap (0, or -1 for an
unparsable or oversized one) with a fair verdict and never `infra_error`; the gold patches and
a correct fix written differently (a whole-file rewrite) earn 1 in the same batch, after all the
hostile ones. The same corpus under the opt-in `similarity` reward shows why it is not the
default: it pays the look-alike patches that fix nothing.
"""

from __future__ import annotations

import shutil

import pytest
from corpus_swe import CASES, LARGEST, RIGHT
from hostile_cases import failures

from cascade.config import DomainConfig, SweReward
from cascade.domains import make_domain
from cascade.domains.base import RewardVerdict

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def verdicts() -> tuple[list[RewardVerdict], list[RewardVerdict]]:
    assert all(not c.reward_config for c in [*CASES, *RIGHT]), "one batch under the default reward"
    domain = make_domain(DomainConfig(name="swe"))
    problems = [c.problem for c in CASES] + [r.problem for r in RIGHT]
    got = domain.score_batch(problems, [c.completion for c in CASES] + [r.completion for r in RIGHT])
    return got[: len(CASES)], got[len(CASES) :]


def test_corpus_covers_each_class() -> None:
    names = {c.name for c in CASES}
    assert len(CASES) >= 10
    for needed in (
        "comment_appended_to_buggy_line",
        "buggy_line_deleted",
        "gold_hunk_then_its_revert",
        "junk_line_in_the_right_file",
        "edits_the_tests_to_pass",
        "conftest_hook_passes_everything",
        "sys_exit_0_at_import",
        "os_exit_0_at_import",
        "parent_directory_path",
        "huge_patch",
        "git_binary_patch",
        "hunk_header_lies",
        "rename_into_the_test_file",
        "test_id_always_equal_object",
        "test_id_forged_test_verdict",
        "test_id_verdict_written_on_the_pipe",
        "shadows_the_test_package",
        "shadows_unittest",
    ):
        assert needed in names


def test_hostile_patches_earn_nothing_and_are_never_infra(
    verdicts: tuple[list[RewardVerdict], list[RewardVerdict]],
) -> None:
    hostile, _ = verdicts
    assert failures(CASES, hostile) == []


def test_right_patches_are_paid_in_the_same_batch(
    verdicts: tuple[list[RewardVerdict], list[RewardVerdict]],
) -> None:
    _, right = verdicts
    wrong = [(r.name, v) for r, v in zip(RIGHT, right, strict=True) if v.reward != pytest.approx(r.reward)]
    assert wrong == []


def test_the_similarity_reward_pays_look_alikes_and_underpays_a_rewrite() -> None:
    """Why `similarity` is opt-in only: the same patches under it (no sandbox involved)."""
    domain = make_domain(DomainConfig(name="swe", reward=SweReward(mode="similarity")))
    by_name = {c.name: c for c in CASES} | {r.name: r for r in RIGHT}
    names = ["comment_appended_to_buggy_line", "junk_line_in_the_right_file", "whole_file_rewrite"]
    got = {n: domain.score(LARGEST, by_name[n].completion).reward for n in names}
    assert got["comment_appended_to_buggy_line"] > 0.5 and got["junk_line_in_the_right_file"] > 0.3
    assert got["whole_file_rewrite"] < 0.9

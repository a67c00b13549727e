"""Verdict text is always encodable: valid UTF-8, no control characters but newline and tab, capped."""

from __future__ import annotations

import json

import pytest

from cascade.domains.base import INFRA_ERROR, OK, WRONG_ANSWER, RewardVerdict
from cascade.domains.verdict_text import MAX_DETAIL_CHARS, MAX_REASON_CHARS, verdict_text
from cascade_proto.v1 import reward_pb2

POISON = "got \ud800 \udfff\x00\x07\x1b[2J\x1b]0;title\x07\r\n\x85\u202e\u2066evil\r end\t."


def test_lone_surrogates_become_replacement_characters() -> None:
    text = verdict_text("a\ud800b\udc00c")
    assert text == "a\ufffdb\ufffdc"
    text.encode("utf-8")  # would raise on a lone surrogate


def test_control_characters_are_stripped_newline_and_tab_kept() -> None:
    assert verdict_text(POISON) == "got \ufffd \ufffd[2J]0;title\nevil end\t."
    assert verdict_text("line 1\nline 2\ttab") == "line 1\nline 2\ttab"
    assert verdict_text("plain ascii: 1 + 1 = 2") == "plain ascii: 1 + 1 = 2"
    assert verdict_text("unicode kept: √2, π, 你好, 😀") == "unicode kept: √2, π, 你好, 😀"


@pytest.mark.parametrize("n", [MAX_DETAIL_CHARS, MAX_DETAIL_CHARS + 1, 10 * MAX_DETAIL_CHARS, 10**7])
def test_length_is_capped_with_the_original_length(n: int) -> None:
    text = verdict_text("x" * n)
    assert len(text) <= MAX_DETAIL_CHARS
    if n <= MAX_DETAIL_CHARS:
        assert text == "x" * n
    else:
        assert text.endswith(f" [cut: {n} chars in all]") and text.startswith("x" * 1000)


def test_cap_counts_what_is_left_after_stripping() -> None:
    assert verdict_text("\x00" * (3 * MAX_DETAIL_CHARS) + "tail").endswith("chars in all]")
    assert verdict_text("\x00" * 10 + "ok", max_chars=64) == "ok"
    assert len(verdict_text("é" * 100, max_chars=10)) == 10


def test_non_strings_are_printed_and_a_hostile_str_cannot_fail() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert verdict_text(ValueError("bad\x00")) == "bad"
    assert verdict_text(Hostile()) == "<unprintable Hostile: RuntimeError>"


def test_every_verdict_is_sanitised_on_construction() -> None:
    v = RewardVerdict(0.0, WRONG_ANSWER, POISON)
    assert v.detail == verdict_text(POISON)
    long_reason = RewardVerdict(0.0, "r\x00" * 100, "x" * (MAX_DETAIL_CHARS * 3))
    assert len(long_reason.reason) <= MAX_REASON_CHARS and "\x00" not in long_reason.reason
    assert len(long_reason.detail) <= MAX_DETAIL_CHARS
    assert RewardVerdict(1, OK) == RewardVerdict(1.0, OK, "")
    assert isinstance(RewardVerdict(1, OK).reward, float)
    # Encodable everywhere it goes: protobuf, JSON (Celery, the store), UTF-8 logs.
    reward_pb2.Verdict(index=0, problem_id="p", reward=v.reward, reason=v.reason, detail=v.detail)
    json.dumps([v.reward, v.reason, v.detail], ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_reward_is_an_infra_error_not_a_score(reward: float) -> None:
    v = RewardVerdict(reward, OK, "rm score")
    assert v.reward == 0.0 and v.reason == INFRA_ERROR and v.is_infra_error
    assert "non-finite reward" in v.detail and "rm score" in v.detail


def test_unsanitised_text_would_fail_protobuf() -> None:
    """Why this exists: protobuf refuses a string with a lone surrogate (the whole RPC failed)."""
    with pytest.raises((ValueError, UnicodeError)):
        reward_pb2.Verdict(detail="\ud800").SerializeToString()

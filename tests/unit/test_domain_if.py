"""Instruction-following domain: the rule registry, generation and scoring."""

from __future__ import annotations

import json

import pytest

from cascade.config import IfReward
from cascade.domains.base import INFRA_ERROR, NO_ANSWER, OK, WRONG_ANSWER, Problem
from cascade.domains.if_rules import REGISTRY, rule_from_json
from cascade.domains.instruct import IfDomain

REQUIRED_RULES = {
    "topic_words",
    "all_uppercase",
    "all_lowercase",
    "word_count",
    "include_word",
    "exclude_word",
    "json_keys",
    "bullet_count",
    "start_with",
    "end_with",
    "no_commas",
}

RULE_CASES = [
    ({"name": "all_uppercase"}, "- RED\n- FOX", "- Red\n- FOX"),
    ({"name": "all_uppercase"}, "RED 42", "123"),
    ({"name": "all_lowercase"}, "red fox", "red Fox"),
    ({"name": "word_count", "params": {"n": 3}}, "red fox sun", "red fox"),
    ({"name": "word_count", "params": {"n": 2}}, "- red\n- fox", "red fox, sun"),
    ({"name": "include_word", "params": {"word": "fox"}}, "RED FOX", "red foxes"),
    ({"name": "exclude_word", "params": {"word": "cat"}}, "red fox", "red CAT"),
    ({"name": "json_keys", "params": {"keys": ["words"]}}, '{"words":["a"]}', '["words"]'),
    ({"name": "json_keys", "params": {"keys": ["words"]}}, '```json\n{"words": 1}\n```', '{"word": 1}'),
    ({"name": "json_keys", "params": {"keys": ["a", "b"]}}, '{"a":1,"b":2}', '{"a":1}'),
    ({"name": "bullet_count", "params": {"n": 2}}, "- red\n- fox\n", "- red\n- fox\n- sun"),
    ({"name": "bullet_count", "params": {"n": 2}}, "  - red\n-   fox", "Here:\n- red\n- fox"),
    ({"name": "start_with", "params": {"word": "RED"}}, "- RED\n- FOX", "FOX RED"),
    ({"name": "end_with", "params": {"word": "sun"}}, "red fox sun.", "sun red"),
    ({"name": "no_commas"}, "red fox", "red, fox"),
]


def test_registry_has_the_required_rules() -> None:
    assert REQUIRED_RULES <= set(REGISTRY)
    with pytest.raises(ValueError, match="unknown instruction rule"):
        rule_from_json({"name": "no_such_rule"})


@pytest.mark.parametrize(("record", "good", "bad"), RULE_CASES)
def test_rule_checks(record: dict, good: str, bad: str) -> None:
    rule = rule_from_json(record)
    assert rule.check(good)
    assert not rule.check(bad)
    assert rule_from_json(rule.to_json()).check(good)
    assert rule.describe().endswith(".")


def test_problems_deterministic_short_and_disjoint() -> None:
    d = IfDomain()
    a = d.make_problems("train", 300, 5)
    assert a == d.make_problems("train", 300, 5)
    assert a != d.make_problems("train", 300, 6)
    evals, sft = d.make_problems("eval", 200, 5), d.make_problems("sft", 200, 5)
    prompts = [{p.prompt for p in ps} for ps in (a, evals, sft)]
    assert [len(s) for s in prompts] == [300, 200, 200]
    assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2] and not prompts[1] & prompts[2]
    assert sft[3].id == "if-sft-3"
    for p in a + evals + sft:
        assert len(p.prompt) <= 80 and len(p.answer) <= 40, p
        assert p.prompt.startswith("Words: ")
        assert p.meta["rules"][0]["name"] == "topic_words"  # the gate, then 2-3 instructions
        assert 3 <= len(p.meta["rules"]) <= 4
        json.dumps(p.meta)
    assert {p.meta["format"] for p in a} == {"plain", "bullets", "json"}
    assert {r["name"] for p in a for r in p.meta["rules"]} == REQUIRED_RULES


def test_prompt_states_every_rule() -> None:
    for p in IfDomain().make_problems("train", 100, 0):
        for record in p.meta["rules"]:
            assert rule_from_json(record).describe() in p.prompt


def test_every_reference_answer_scores_one() -> None:
    """The tiny model's SFT data is these answers: each must pass every rule, the gate included,
    in the demo's splits and sizes (examples/tiny-cascade.yaml) and the SFT split."""
    d = IfDomain()
    problems = d.make_problems("train", 2000, 0) + d.make_problems("eval", 256, 0)
    problems += d.make_problems("sft", 2000, 0)
    verdicts = d.score_batch(problems, [p.answer for p in problems])
    assert {v.reason for v in verdicts} == {OK}
    assert all(v.reward == 1.0 for v in verdicts)


def test_prompts_are_unchanged_by_the_gate() -> None:
    """The topic rule's sentence is the prompt's old opening, so the demo's prompts stay the same."""
    p = IfDomain().make_problems("train", 1, 0)[0]
    topic = p.meta["rules"][0]["params"]["words"]
    assert p.prompt.startswith(f"Words: {' '.join(topic)}. ")
    assert p.prompt == " ".join(rule_from_json(r).describe() for r in p.meta["rules"])


def _gated() -> Problem:
    rules = [
        {"name": "topic_words", "params": {"words": ["red", "fox", "sun"]}},
        {"name": "bullet_count", "params": {"n": 3}},
        {"name": "all_uppercase", "params": {}},
    ]
    prompt = "Words: red fox sun. 3 bullets. All caps."
    return Problem(
        id="if-test-1", domain="if", prompt=prompt, answer="- RED\n- FOX\n- SUN", meta={"rules": rules}
    )


@pytest.mark.parametrize("mode", ["all_pass", "fraction"])
def test_off_topic_reply_earns_nothing_in_either_mode(mode: str) -> None:
    d = IfDomain(IfReward(mode=mode))  # type: ignore[arg-type]
    p = _gated()
    for template in ("- A\n- B\n- C", "- RED\n- RED\n- RED", "- CAT\n- DOG\n- OWL"):
        verdict = d.score(p, template)
        assert (verdict.reward, verdict.reason) == (0.0, WRONG_ANSWER), template
        assert verdict.detail.startswith("off topic; failed: topic_words")
    assert d.score(p, "- RED\n- FOX\n- SUN").reward == 1.0
    assert d.score(p, "- red\n- fox\n- sun").reward == (0.0 if mode == "all_pass" else pytest.approx(2 / 3))


def _problem() -> Problem:
    rules = [
        {"name": "bullet_count", "params": {"n": 3}},
        {"name": "all_uppercase", "params": {}},
        {"name": "end_with", "params": {"word": "SUN"}},
    ]
    prompt = "Words: red fox sun. 3 bullets. All caps. End with SUN."
    answer = "- RED\n- FOX\n- SUN"
    return Problem(id="if-test-0", domain="if", prompt=prompt, answer=answer, meta={"rules": rules})


def test_correct_and_incorrect_answers() -> None:
    d = IfDomain(IfReward(mode="all_pass"))
    p = _problem()
    assert d.score(p, "- RED\n- FOX\n- SUN").reason == OK
    assert d.score(p, "<think>caps</think>\n- RED\n- FOX\n- SUN").reward == 1.0
    wrong = d.score(p, "- red\n- fox\n- sun")
    assert (wrong.reason, wrong.reward) == (WRONG_ANSWER, 0.0)
    assert "all_uppercase" in wrong.detail and "bullet_count" not in wrong.detail
    assert d.score(p, "").reason == NO_ANSWER
    assert d.score(p, "<think>still thinking").reason == NO_ANSWER


def test_fraction_mode() -> None:
    d = IfDomain(IfReward(mode="fraction"))
    p = _problem()
    assert d.score(p, "- red\n- fox\n- sun").reward == pytest.approx(1 / 3)  # case-sensitive end word
    assert d.score(p, "- RED\n- FOX\n- MOON").reward == pytest.approx(2 / 3)
    assert d.score(p, "RED FOX SUN").reward == pytest.approx(2 / 3)
    assert d.score(p, "red fox").reward == 0.0
    assert d.score(p, "- RED\n- FOX\n- SUN").reward == 1.0


def test_bad_rules_are_infra_error() -> None:
    p = Problem(id="x", domain="if", prompt="p", answer="a", meta={"rules": [{"name": "nope"}]})
    assert IfDomain().score(p, "a").reason == INFRA_ERROR

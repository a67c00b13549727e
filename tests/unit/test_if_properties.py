"""Issue 33 on the instruction-following domain, generated rather than listed: rule combinations
(1-3 rules drawn from the registry, params drawn within their valid ranges, stored in `meta` as
the domain stores them) against degenerate, edited and hostile replies, every one scored through
the domain's `score_batch` as training scores it (`make_domain`, behind the length bound).

1. Degenerate replies (blank, reasoning only, punctuation, `***` dividers, the prompt echoed, one
   repeated character, an empty JSON or markup skeleton) earn 0 on every topic-gated problem: the
   domain's own synthetic problems and the registry's rules behind a topic gate. IFEval rows have
   no topic, so there only the blank and reasoning-only replies are guaranteed 0 (a content-free
   reply that meets the format is paid, as IFEval pays it: docs/verifiers.md).
2. Irrelevant edits: whitespace around a completion never changes its verdict; a rule held keeps
   holding when text is added after it (for rules asking for "at least" something), a rule broken
   stays broken when text is added before and after (forbidden words, commas, "at most" counts).
3. Every reward is in [0, 1] and scoring never raises on arbitrary Unicode, and a 20,000-character
   hostile reply scores within a generous time bound (no catastrophic backtracking).

Derandomized, so `make test` sees the same examples every run; the budget is small by default and
scaled by `CASCADE_HYPOTHESIS_SCALE` for a longer run (`make test-properties`).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_budget import examples

from cascade.config import DomainConfig, IfReward
from cascade.domains import make_domain
from cascade.domains.base import INFRA_ERROR, NO_ANSWER, Domain, Problem, RewardVerdict
from cascade.domains.if_rules import REGISTRY, RELATIONS, rule_from_json
from cascade.domains.instruct import VOCAB
from cascade.model.chat import strip_thinking

MODES = ("all_pass", "fraction")
DOMAINS: dict[str, Domain] = {
    mode: make_domain(DomainConfig(name="if", reward=IfReward(mode=mode))) for mode in MODES
}
SETTINGS = settings(
    derandomize=True,
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------- rule combinations

_WORD = st.sampled_from(VOCAB)
_RELATION = st.sampled_from(RELATIONS)
_N = st.integers(0, 6)


def _paragraph_first_word() -> st.SearchStrategy[dict[str, Any]]:
    return st.integers(1, 4).flatmap(
        lambda num: st.fixed_dictionaries(
            {"num_paragraphs": st.just(num), "nth_paragraph": st.integers(1, num), "first_word": _WORD}
        )
    )


PARAMS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "all_lowercase": st.just({}),
    "all_uppercase": st.just({}),
    "bullet_count": st.fixed_dictionaries({"n": _N}),
    "constrained_response": st.just({}),
    "end_with": st.fixed_dictionaries({"word": _WORD}),
    "end_with_phrase": st.fixed_dictionaries(
        {"phrase": st.sampled_from(["Is there anything else I can help with?", "red fox", "***"])}
    ),
    "english_lowercase": st.just({}),
    "english_uppercase": st.just({}),
    "exclude_word": st.fixed_dictionaries({"word": _WORD}),
    "highlight_count": st.fixed_dictionaries({"n": _N}),
    "include_word": st.fixed_dictionaries({"word": _WORD}),
    "json_format": st.just({}),
    "json_keys": st.fixed_dictionaries({"keys": st.lists(_WORD, min_size=1, max_size=2, unique=True)}),
    "keyword_frequency": st.fixed_dictionaries({"word": _WORD, "relation": _RELATION, "n": _N}),
    "letter_frequency": st.fixed_dictionaries(
        {"letter": st.sampled_from("abcdefghijklmnopqrstuvwxyzAEZ"), "relation": _RELATION, "n": _N}
    ),
    "lowercase_word_frequency": st.fixed_dictionaries({"relation": _RELATION, "n": _N}),
    "markdown_bullets": st.fixed_dictionaries({"n": _N}),
    "max_words": st.fixed_dictionaries({"n": _N}),
    "min_words": st.fixed_dictionaries({"n": _N}),
    "no_commas": st.just({}),
    "paragraph_count": st.fixed_dictionaries({"n": _N}),
    "paragraph_first_word": _paragraph_first_word(),
    "placeholder_count": st.fixed_dictionaries({"n": _N}),
    "postscript": st.fixed_dictionaries({"marker": st.sampled_from(["P.S.", "P.P.S", "PS:"])}),
    "quotation": st.just({}),
    "response_language": st.fixed_dictionaries({"language": st.sampled_from(["en", "fr", "de", "ja", "ru"])}),
    "section_count": st.fixed_dictionaries(
        {"splitter": st.sampled_from(["Section", "SECTION", "Part"]), "n": _N}
    ),
    "sentence_count": st.fixed_dictionaries({"relation": _RELATION, "n": _N}),
    "start_with": st.fixed_dictionaries({"word": _WORD}),
    "start_with_phrase": st.fixed_dictionaries({"phrase": st.sampled_from(["My answer is", "red fox", "*"])}),
    "title": st.just({}),
    "topic_words": st.fixed_dictionaries({"words": st.lists(_WORD, min_size=1, max_size=4, unique=True)}),
    "two_responses": st.just({}),
    "uppercase_word_frequency": st.fixed_dictionaries({"relation": _RELATION, "n": _N}),
    "word_count": st.fixed_dictionaries({"n": _N}),
}


def test_every_registered_rule_is_generated() -> None:
    """A rule added to the registry must get a params strategy here (or the properties miss it)."""
    assert set(PARAMS) == set(REGISTRY)


def _record(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return rule_from_json({"name": name, "params": params}).to_json()  # validated, as meta stores it


def rule_records(names: list[str] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    pool = sorted(REGISTRY) if names is None else names
    return st.sampled_from(pool).flatmap(lambda name: PARAMS[name].map(lambda params: _record(name, params)))


COMBOS = st.lists(rule_records(), min_size=1, max_size=3)
TOPICS = st.lists(_WORD, min_size=1, max_size=4, unique=True)


def make_problem(records: list[dict[str, Any]]) -> Problem:
    """A problem in the domain's own shape: `meta.rules` the rule records, the prompt their sentences."""
    prompt = " ".join(rule_from_json(record).describe() for record in records)
    return Problem(id="if-prop-0", domain="if", prompt=prompt, answer="", meta={"rules": records})


def gated(topic: list[str], records: list[dict[str, Any]]) -> Problem:
    """The toy domain's shape: the topic gate first, then the rules."""
    return make_problem([_record("topic_words", {"words": topic}), *records])


def score(problem: Problem, completion: str, mode: str = "all_pass") -> RewardVerdict:
    (verdict,) = DOMAINS[mode].score_batch([problem], [completion])
    return verdict


# --------------------------------------------------------------------------- 1. degenerate replies

_SPACES = st.text(alphabet=" \t\n\r\x0b\x0c\u0085\u00a0\u2003\u2028\u3000", max_size=12)
"""Whitespace (`str.isspace`), which scoring strips from the ends of a response."""
_WHITESPACE = st.text(alphabet=" \t\n\r\u00a0\u2003\u3000\u200b\u200d\u2060\ufeff\u00ad", max_size=12)
"""Blank text: whitespace and invisible format characters (zero-width space, joiners, BOM, soft hyphen)."""
_PUNCTUATION = st.text(
    alphabet="!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\u2014\u2026\u00ab\u00bb\u3002", min_size=1, max_size=40
)
_SEPARATORS = st.lists(
    st.sampled_from(["***", "******", "* * *", "---", "***\n"]), min_size=1, max_size=6
).map("\n".join)
_SKELETONS = st.sampled_from(
    [
        "{}",
        "[]",
        '""',
        '{"": ""}',
        '{"words": []}',
        '{"words": ""}',
        '{"items": [], "list": {}}',
        "```json\n{}\n```",
        "```\n```",
        "<<>>",
        "<< >>",
        "[]",
        "- \n- \n- ",
        "* \n* \n*",
        "<p></p>",
        "<html><body></body></html>",
        "<response/>",
        "** **",
        "Section \nSection ",
        "P.S.",
        '"  "',
        "\u201c\u201d",
    ]
)
_REPEATED = st.tuples(st.characters(codec="utf-8"), st.integers(1, 200)).map(lambda t: t[0] * t[1])
_REASONING = st.text(max_size=60).filter(lambda t: "</think>" not in t and "<think>" not in t)


def _reasoning_only(thought: str, tail: str, closed: bool) -> str:
    return f"<think>{thought}</think>{tail}" if closed else f"{tail}<think>{thought}"


BLANK_OR_REASONING = st.one_of(
    _WHITESPACE,
    st.builds(_reasoning_only, _REASONING, _WHITESPACE, st.booleans()),
)
CONTENT_FREE = st.one_of(BLANK_OR_REASONING, _PUNCTUATION, _SEPARATORS, _SKELETONS, _REPEATED)


def _not_about(topic: list[str], reply: str) -> bool:
    """Whether the reply's response (reasoning dropped) spells no topic word: a content-free reply
    never does (no word of VOCAB is one repeated letter), a thought may."""
    return not any(word in strip_thinking(reply).lower() for word in topic)


@SETTINGS
@given(records=COMBOS, reply=BLANK_OR_REASONING, mode=st.sampled_from(MODES))
def test_blank_or_reasoning_only_earns_nothing_under_any_rules(
    records: list[dict[str, Any]], reply: str, mode: str
) -> None:
    """Without a topic too (IFEval rows): a blank or reasoning-only reply follows no instruction."""
    verdict = score(make_problem(records), reply, mode)
    assert (verdict.reward, verdict.reason) == (0.0, NO_ANSWER), (reply, records)


@SETTINGS
@given(topic=TOPICS, records=COMBOS, reply=CONTENT_FREE, mode=st.sampled_from(MODES))
def test_content_free_replies_earn_nothing_behind_the_topic(
    topic: list[str], records: list[dict[str, Any]], reply: str, mode: str
) -> None:
    """Whatever the rules ("no commas", "fewer than 3 sentences", "at most 0 words"...), a reply
    with nothing in it earns 0 on a problem with a topic, in either reward mode."""
    problem = gated(topic, records)
    if _not_about(topic, reply):
        assert score(problem, reply, mode).reward == 0.0, (reply, records)
    for echo in (problem.prompt, problem.prompt.upper(), f"{reply}\n{problem.prompt}\n{reply}"):
        assert score(problem, echo, mode).reward == 0.0, (echo, records)


@SETTINGS
@given(seed=st.integers(0, 10_000), index=st.integers(0, 9), reply=CONTENT_FREE, mode=st.sampled_from(MODES))
def test_degenerate_replies_earn_nothing_on_the_synthetic_problems(
    seed: int, index: int, reply: str, mode: str
) -> None:
    problem = DOMAINS[mode].make_problems("train", 10, seed)[index]
    for completion in (
        reply,
        problem.prompt,
        f"<think>{problem.answer}</think>",
        f"{reply}\n{problem.prompt}",
    ):
        assert score(problem, completion, mode).reward == 0.0, (completion, problem.meta)
    assert score(problem, problem.answer, mode).reward == 1.0  # (the reference is still paid)


# Regressions: the minimal examples the properties above found.


@pytest.mark.parametrize(
    "reply", ["\u200b", "\ufeff", "\u2060\u200d", "\u00ad", " \u200b\n", "<think>x</think>\u200b"]
)
def test_an_invisible_reply_is_blank(reply: str) -> None:
    """Was paid 1 for "no commas" (IFEval rows, no topic): a zero-width space is not an answer."""
    for mode in MODES:
        assert score(make_problem([_record("no_commas", {})]), reply, mode).reward == 0.0
    assert score(make_problem([_record("no_commas", {})]), "\u200bOk.\u200b").reward == 1.0


def test_an_echoed_prompt_earns_nothing_on_a_toy_problem() -> None:
    """Was paid 0.5 in `fraction` mode (synthetic problem train/seed 6/#6): the prompt's words are
    half topic words (the gate holds) and it names `milk` (include_word holds)."""
    problem = gated(
        ["sky", "ship", "gold", "milk"],
        [
            _record("bullet_count", {"n": 4}),
            _record("start_with", {"word": "sky"}),
            _record("include_word", {"word": "milk"}),
        ],
    )
    assert problem.prompt == "Words: sky ship gold milk. 4 bullets. Start with sky. Use milk."
    for mode in MODES:
        assert score(problem, problem.prompt, mode).reward == 0.0
        assert (
            score(problem, "Words:  SKY ship gold milk.\n4 bullets. Start with sky. Use milk.", mode).reward
            == 0.0
        )
    assert score(problem, "- sky\n- ship\n- gold\n- milk").reward == 1.0
    assert score(problem, "sky ship gold milk", "fraction").reward == 0.75  # a partial answer keeps its share


# --------------------------------------------------------------------------- 2. irrelevant edits

_PIECES = st.sampled_from(
    [
        *VOCAB[:12],
        "RED",
        "Fox",
        ",",
        ".",
        "!",
        "e.g.",
        "*hi*",
        "**bold**",
        "<<title>>",
        "[name]",
        "Section 1",
        "P.S. note",
        "- item",
        "* item",
        "***",
        "don't",
        "fox's",
        "x_fox",
        "My answer is yes.",
        '"',
        "\n",
        "\n\n",
        "{",
        "}",
    ]
)
_GAP = st.sampled_from([" ", "\n", "", "  ", "\t"])
REPLIES = st.lists(st.tuples(_PIECES, _GAP), max_size=25).map(lambda parts: "".join(p + g for p, g in parts))
_NO_TAGS = st.text(max_size=80).filter(lambda t: "think>" not in t)
EXTRA_TEXT = st.one_of(_NO_TAGS, REPLIES)


@SETTINGS
@given(
    topic=st.one_of(st.none(), TOPICS),
    records=COMBOS,
    reply=st.one_of(REPLIES, st.text(max_size=80)),
    before=_SPACES,
    after=_SPACES,
    mode=st.sampled_from(MODES),
)
def test_whitespace_around_a_reply_never_changes_its_verdict(
    topic: list[str] | None, records: list[dict[str, Any]], reply: str, before: str, after: str, mode: str
) -> None:
    problem = make_problem(records) if topic is None else gated(topic, records)
    plain, padded = score(problem, reply, mode), score(problem, before + reply + after, mode)
    assert (padded.reward, padded.reason) == (plain.reward, plain.reason), (reply, records)


KEPT_WHEN_EXTENDED = [
    "include_word",
    "min_words",
    "title",
    "placeholder_count",
    "highlight_count",
    "section_count",
    "postscript",
]
"""Rules asking for something to be there: added text (on a new line) cannot take it away."""
BROKEN_WHEN_EXTENDED = ["exclude_word", "no_commas", "max_words"]
"""Rules asking for something not to be there (or at most so much): added text cannot mend them."""
COUNTED = [
    "keyword_frequency",
    "letter_frequency",
    "uppercase_word_frequency",
    "lowercase_word_frequency",
    "sentence_count",
]
"""Counts with a relation: "at least" is kept, "at most" stays broken."""


def _single(record: dict[str, Any]) -> Problem:
    return make_problem([record])


@SETTINGS
@given(record=rule_records(KEPT_WHEN_EXTENDED + COUNTED), reply=REPLIES, suffix=EXTRA_TEXT)
def test_a_rule_held_keeps_holding_when_text_is_added_after(
    record: dict[str, Any], reply: str, suffix: str
) -> None:
    if record["params"].get("relation", "at least") != "at least":
        return
    problem = _single(record)
    if score(problem, reply).reward == 1.0:
        assert score(problem, f"{reply}\n{suffix}").reward == 1.0, (reply, suffix, record)


@SETTINGS
@given(
    record=rule_records(BROKEN_WHEN_EXTENDED + COUNTED), reply=REPLIES, prefix=EXTRA_TEXT, suffix=EXTRA_TEXT
)
def test_a_rule_broken_stays_broken_when_text_is_added_around_it(
    record: dict[str, Any], reply: str, prefix: str, suffix: str
) -> None:
    if record["params"].get("relation", "at most") != "at most":
        return
    problem = _single(record)
    if reply.strip() and score(problem, reply).reward == 0.0:
        assert score(problem, f"{prefix}\n{reply}\n{suffix}").reward == 0.0, (prefix, reply, suffix, record)


@SETTINGS
@given(topic=TOPICS, records=COMBOS, reply=REPLIES, prefix=EXTRA_TEXT, suffix=EXTRA_TEXT)
def test_a_forbidden_word_is_never_hidden_by_surrounding_text(
    topic: list[str], records: list[dict[str, Any]], reply: str, prefix: str, suffix: str
) -> None:
    """A reply that writes a forbidden word (in any spelling) earns 0 however it is surrounded."""
    forbidden = next((w for w in VOCAB if w not in topic), "owl")
    problem = gated(topic, [_record("exclude_word", {"word": forbidden}), *records])
    for spelling in (forbidden, forbidden.upper(), f"{forbidden}'s", f"x_{forbidden}"):
        completion = f"{prefix}\n{reply} {spelling} {' '.join(topic * 3)}\n{suffix}"
        assert score(problem, completion).reward == 0.0, (completion, records)


# --------------------------------------------------------------------------- 3. hostile text

_ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)
"""Any Unicode text (every category; surrogates, which no UTF-8 reply can hold, left out)."""
_LONG_LINE = st.tuples(_ANY_TEXT, st.integers(1, 60)).map(lambda t: (t[0] * t[1])[:12_000])


def _is_verdict(verdict: RewardVerdict) -> bool:
    return 0.0 <= verdict.reward <= 1.0 and verdict.reason != INFRA_ERROR


@SETTINGS
@given(
    topic=st.one_of(st.none(), TOPICS),
    records=COMBOS,
    reply=st.one_of(_ANY_TEXT, _LONG_LINE),
    mode=st.sampled_from(MODES),
)
def test_any_unicode_reply_gets_a_reward_in_range(
    topic: list[str] | None, records: list[dict[str, Any]], reply: str, mode: str
) -> None:
    problem = make_problem(records) if topic is None else gated(topic, records)
    assert _is_verdict(score(problem, reply, mode)), (reply[:200], records)


HOSTILE_UNITS = st.lists(
    st.sampled_from(
        [
            "*",
            "**",
            "***",
            "******",
            "<<",
            ">>",
            "<",
            "[",
            "]",
            "'",
            "\u2019",
            "a",
            "A",
            "_",
            "x'",
            ".",
            "e.g.",
            "P. S.",
            "P.S",
            "-",
            "- ",
            "\n",
            " ",
            "\t",
            "my answer is ",
            "My answer is yes",
            "```",
            "```json",
            "{",
            '{"a":',
            "[",
            '"',
            "\u201c",
            ",",
            "Section ",
            "1",
            "\u0301",
            "\u00e9",
            "\u4e2d",
            "\u03a3",
        ]
    ),
    min_size=1,
    max_size=8,
).map("".join)
HOSTILE_CHARS = 20_000
TIME_BOUND_S = 2.0
"""Generous: a linear check of 20,000 characters takes milliseconds (langdetect, the slowest, tens)."""


def _hostile(unit: str, tail: str) -> str:
    return ((unit * (HOSTILE_CHARS // len(unit) + 1))[: HOSTILE_CHARS - len(tail)] + tail).strip() or "x"


@settings(
    derandomize=True,
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    topic=st.one_of(st.none(), TOPICS),
    records=COMBOS,
    unit=HOSTILE_UNITS,
    tail=st.sampled_from(["", "!", "x", "*", "\n"]),
)
def test_a_long_hostile_reply_scores_quickly(
    topic: list[str] | None, records: list[dict[str, Any]], unit: str, tail: str
) -> None:
    problem = make_problem(records) if topic is None else gated(topic, records)
    reply = _hostile(unit, tail)
    start = time.perf_counter()
    verdict = score(problem, reply)
    elapsed = time.perf_counter() - start
    assert _is_verdict(verdict)
    assert elapsed < TIME_BOUND_S, (unit, tail, records, elapsed)


def _every_rule() -> Problem:
    params: dict[str, dict[str, Any]] = {
        "bullet_count": {"n": 2},
        "end_with": {"word": "fox"},
        "end_with_phrase": {"phrase": "red fox"},
        "exclude_word": {"word": "cat"},
        "highlight_count": {"n": 3},
        "include_word": {"word": "fox"},
        "json_keys": {"keys": ["a"]},
        "keyword_frequency": {"word": "fox", "relation": "at least", "n": 2},
        "letter_frequency": {"letter": "a", "relation": "at most", "n": 3},
        "lowercase_word_frequency": {"relation": "at least", "n": 2},
        "markdown_bullets": {"n": 3},
        "max_words": {"n": 5},
        "min_words": {"n": 3},
        "paragraph_count": {"n": 3},
        "paragraph_first_word": {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "fox"},
        "placeholder_count": {"n": 2},
        "postscript": {"marker": "P.S."},
        "response_language": {"language": "en"},
        "section_count": {"splitter": "Section", "n": 2},
        "sentence_count": {"relation": "exactly", "n": 2},
        "start_with": {"word": "red"},
        "start_with_phrase": {"phrase": "My answer is"},
        "topic_words": {"words": ["red", "fox"]},
        "uppercase_word_frequency": {"relation": "at most", "n": 1},
        "word_count": {"n": 2},
    }
    records = [_record(name, value) for name, value in params.items()]
    records += [_record(name, {}) for name in sorted(REGISTRY) if not REGISTRY[name].arguments]
    assert {r["name"] for r in records} == set(REGISTRY)
    return make_problem(records)


EVERY_RULE = _every_rule()


@settings(
    derandomize=True,
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(unit=HOSTILE_UNITS, tail=st.sampled_from(["", "!", "x", "*", "\n"]), mode=st.sampled_from(MODES))
def test_every_rule_at_once_scores_a_long_hostile_reply_quickly(unit: str, tail: str, mode: str) -> None:
    reply = _hostile(unit, tail)
    start = time.perf_counter()
    verdict = score(EVERY_RULE, reply, mode)
    elapsed = time.perf_counter() - start
    assert _is_verdict(verdict)
    assert elapsed < TIME_BOUND_S * 2, (unit, tail, elapsed)  # every rule, three of them langdetect


@pytest.mark.parametrize("unit", ["[", "{", '{"a":', "```json\n[", "<<", "**", "a'", "\u0301"])
def test_deep_or_unclosed_markup_scores_quickly(unit: str) -> None:
    """Explicit worst cases of the generator: deep JSON nesting, unclosed brackets and emphasis."""
    reply = _hostile(unit, "")
    start = time.perf_counter()
    verdict = score(EVERY_RULE, reply)
    assert _is_verdict(verdict) and time.perf_counter() - start < TIME_BOUND_S * 2

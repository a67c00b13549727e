"""The IFEval-style rule registry: every rule's check, its JSON form, and strict/loose modes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cascade.domains.if_rules import (
    REGISTRY,
    Rule,
    blank_line_paragraphs,
    check_rules,
    loose_variants,
    paragraphs,
    registry_spec,
    rule_from_json,
    sentences,
)

GREEK_WORD = "\u03ba\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1"  # one word, no ASCII letter

# (record, a response that satisfies it, one that does not); every registered rule appears.
CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"name": "all_uppercase"}, "RED FOX", "Red fox"),
    ({"name": "all_uppercase"}, "\u0391\u0392\u0393 42", "\u732b\u548c\u72d7"),
    ({"name": "all_uppercase"}, "RED FOX!", "RED \u732b"),
    ({"name": "all_lowercase"}, "red fox", "Red fox"),
    ({"name": "all_lowercase"}, "caf\u00e9 au lait", "\u732b\u548c\u72d7"),
    ({"name": "word_count", "params": {"n": 3}}, "red fox sun", "red fox"),
    (
        {"name": "word_count", "params": {"n": 2}},
        "don't caf\u00e9",
        "\u03ba\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1",
    ),
    ({"name": "include_word", "params": {"word": "fox"}}, "a FOX", "many foxes"),
    ({"name": "include_word", "params": {"word": "fox"}}, "the fox's den", "a firefox"),
    ({"name": "exclude_word", "params": {"word": "cat"}}, "a dog", "a Cat"),
    ({"name": "exclude_word", "params": {"word": "bad"}}, "a badge, don't", "the bad's end"),
    ({"name": "topic_words", "params": {"words": ["red", "fox"]}}, '{"words": ["red", "fox"]}', "- A\n- B"),
    ({"name": "topic_words", "params": {"words": ["red", "fox"]}}, "RED FOX", "red fox cat dog sun moon"),
    ({"name": "json_keys", "params": {"keys": ["a"]}}, '{"a": 1}', '{"b": 1}'),
    ({"name": "bullet_count", "params": {"n": 2}}, "- a\n- b", "- a\n- b\n- c"),
    ({"name": "start_with", "params": {"word": "RED"}}, "RED fox", "fox RED"),
    ({"name": "end_with", "params": {"word": "sun"}}, "red sun.", "sun red"),
    ({"name": "no_commas"}, "a b", "a, b"),
    ({"name": "min_words", "params": {"n": 3}}, "one two three", "one two"),
    ({"name": "max_words", "params": {"n": 3}}, "one, two, three!", "one two three four"),
    (
        {"name": "sentence_count", "params": {"relation": "at most", "n": 2}},
        "One thing. Two things!",
        "One. Two? Three.",
    ),
    (
        {"name": "sentence_count", "params": {"relation": "exactly", "n": 3}},
        "Dr. Who came at 3.14 pm. It rained, e.g. hard. We left.",
        "Dr. Who came. It rained.",
    ),
    (
        {"name": "sentence_count", "params": {"relation": "at least", "n": 2}},
        "Wait... what? Yes.",
        "A title line\nThen one sentence, as Punkt counts it.",
    ),
    (
        {"name": "sentence_count", "params": {"relation": "exactly", "n": 2}},
        f"{GREEK_WORD}. {GREEK_WORD}!",
        "... ***",
    ),
    ({"name": "paragraph_count", "params": {"n": 2}}, "First para.\n***\nSecond para.", "First.\n\nSecond."),
    (
        {"name": "paragraph_count", "params": {"n": 3}},
        "a\n***\nb\n\n\n***\n\nc\n***",
        "a\n***\n\n***\nb\n***\nc",
    ),
    (
        {"name": "keyword_frequency", "params": {"word": "fox", "relation": "at least", "n": 2}},
        "Fox and fox.",
        "fox and foxes",
    ),
    (
        {"name": "letter_frequency", "params": {"letter": "z", "relation": "at most", "n": 1}},
        "Zoo",
        "Jazz",
    ),
    (
        {"name": "uppercase_word_frequency", "params": {"relation": "at least", "n": 2}},
        "NASA and ESA",
        "NASA and Esa",
    ),
    (
        {"name": "lowercase_word_frequency", "params": {"relation": "exactly", "n": 2}},
        "Hello big world",
        "hello big world",
    ),
    ({"name": "start_with_phrase", "params": {"phrase": "Dear team"}}, "dear  Team, hi", "Hi dear team"),
    (
        {"name": "end_with_phrase", "params": {"phrase": "Any other questions?"}},
        "Done. Any other  questions?\n",
        "Any other questions? Done.",
    ),
    ({"name": "quotation"}, '  "hello there"\n', 'hello "there"'),
    ({"name": "quotation"}, "\u201chello\u201d", '"'),
    (
        {"name": "end_with_phrase", "params": {"phrase": "Any other questions?"}},
        '"Done. Any other questions?"',
        "Any other questions?!",
    ),
    ({"name": "postscript", "params": {"marker": "P.S."}}, "Hi.\n\nP. S. see you", "Hi. PS see you"),
    ({"name": "postscript", "params": {"marker": "P.S."}}, "Hi.\np.s. later", "Hi.\nP.S."),
    ({"name": "postscript", "params": {"marker": "P.S."}}, "Hi.\n**P.S.**\nsee you", "Look at the maps. see"),
    ({"name": "title"}, "<<My Poem>>\nroses", "<< >> roses <My Poem>"),
    ({"name": "placeholder_count", "params": {"n": 2}}, "Send [name] to [address].", "Send [name] to []."),
    ({"name": "highlight_count", "params": {"n": 2}}, "*one* and **two**", "*one* and ** ** and *\n*"),
    (
        {"name": "section_count", "params": {"splitter": "Section", "n": 2}},
        "Section 1\nfoo\nSection 2\nbar",
        "Section 1\nfoo\nsection two",
    ),
    (
        {"name": "section_count", "params": {"splitter": "SECTION", "n": 2}},
        "## SECTION 1\nfoo\n**SECTION 2**\nbar",
        "SECTION 1 and, as SECTION 2 says, more",
    ),
    ({"name": "json_format"}, "```json\n[1, 2]\n```", '{"a": 1'),
    ({"name": "two_responses"}, "one\n******\ntwo", "one\n******\none"),
    ({"name": "two_responses"}, "******\none\n******\ntwo\n******", "one\n******\n******\ntwo"),
    ({"name": "constrained_response"}, "I think so. My answer is yes.", "My answer is: yes"),
    (
        {"name": "constrained_response"},
        "My answer is no. My answer is no.",
        "My answer is yes. My answer is no. My answer is maybe.",
    ),
    ({"name": "json_format"}, '```JSON\n{"a": 1}\n```', "[" * 100_000 + "]" * 100_000),
    ({"name": "response_language", "params": {"language": "fr"}}, "Bonjour, je suis un chat.", "12345 !!!"),
    (
        {"name": "response_language", "params": {"language": "en"}},
        "The cat sat on the mat and looked out of the window.",
        "Le chat est assis sur le tapis et regarde par la fen\u00eatre.",
    ),
    (
        {"name": "english_uppercase"},
        "THE CAT SAT ON THE MAT BY THE DOOR.",
        "DIE KATZE SITZT AUF DER MATTE UND SCHAUT AUS DEM FENSTER.",
    ),
    ({"name": "english_lowercase"}, "the cat sat on the mat by the door.", "le chat est assis sur le tapis."),
    (
        {"name": "markdown_bullets", "params": {"n": 2}},
        "Intro:\n* one\n  - two\nEnd",
        "* one\n---\n*two*\n- ",
    ),
    (
        {
            "name": "paragraph_first_word",
            "params": {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "sea"},
        },
        "Intro here.\n\n**Sea's** waves.",
        "Intro here.\n\nThe sea.",
    ),
]

ORIGINAL_TEMPLATES = {
    "all_uppercase": "All caps.",
    "all_lowercase": "All lowercase.",
    "word_count": "Exactly {n} words.",
    "include_word": "Use {word}.",
    "exclude_word": "Avoid {word}.",
    "json_keys": "JSON with key {keys_text}.",
    "bullet_count": "{n} bullets.",
    "start_with": "Start with {word}.",
    "end_with": "End with {word}.",
    "no_commas": "No commas.",
}


def test_registry_has_at_least_20_complete_rules() -> None:
    assert len(REGISTRY) >= 20
    for name, cls in REGISTRY.items():
        assert cls.name == name
        assert isinstance(cls.description, str) and cls.description
        assert isinstance(cls.template, str) and cls.template
        assert all(kind in (int, str, list) for kind in cls.arguments.values()), name
        assert callable(cls.check)
    spec = registry_spec()
    assert [row["name"] for row in spec] == sorted(REGISTRY)
    assert {row["name"]: row["arguments"] for row in spec}["keyword_frequency"] == {
        "word": "str",
        "relation": "str",
        "n": "int",
    }
    json.dumps(spec)


def test_original_rules_keep_their_prompt_sentences() -> None:
    for name, template in ORIGINAL_TEMPLATES.items():
        assert REGISTRY[name].template == template
    assert rule_from_json({"name": "json_keys", "params": {"keys": ["a", "b"]}}).describe() == (
        "JSON with key a and b."
    )


def test_every_rule_has_cases() -> None:
    assert {record["name"] for record, _, _ in CASES} == set(REGISTRY)


@pytest.mark.parametrize(
    ("record", "good", "bad"), CASES, ids=[f"{c[0]['name']}-{i}" for i, c in enumerate(CASES)]
)
def test_rule_passes_and_fails(record: dict[str, Any], good: str, bad: str) -> None:
    rule = rule_from_json(record)
    assert rule.check(good)
    assert not rule.check(bad)


@pytest.mark.parametrize(
    "record", [c[0] for c in CASES], ids=[f"{c[0]['name']}-{i}" for i, c in enumerate(CASES)]
)
def test_rule_round_trips_through_json(record: dict[str, Any]) -> None:
    rule = rule_from_json(record)
    encoded = json.dumps(rule.to_json())
    again = rule_from_json(json.loads(encoded))
    assert type(again) is type(rule)
    assert again.to_json() == rule.to_json() == {"name": record["name"], "params": record.get("params", {})}
    assert again.describe() == rule.describe()
    assert set(rule.params) == set(type(rule).arguments)
    for _, good, bad in (c for c in CASES if c[0] == record):
        assert (again.check(good), again.check(bad)) == (True, False)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"name": "min_words"}, "missing param"),
        ({"name": "min_words", "params": {"n": 2, "m": 1}}, "unknown param"),
        ({"name": "min_words", "params": {"n": "2"}}, "must be int"),
        ({"name": "min_words", "params": {"n": True}}, "must be int"),
        ({"name": "min_words", "params": {"n": -1}}, "n must be >= 0"),
        ({"name": "sentence_count", "params": {"relation": "more than", "n": 1}}, "relation must be"),
        (
            {"name": "letter_frequency", "params": {"letter": "ab", "relation": "at least", "n": 1}},
            "one letter",
        ),
        (
            {"name": "keyword_frequency", "params": {"word": "two words", "relation": "at least", "n": 1}},
            "one word",
        ),
        ({"name": "end_with_phrase", "params": {"phrase": "  "}}, "must not be empty"),
        ({"name": "word_count", "params": {"n": 3, "extra": 1}}, "unknown param"),
    ],
)
def test_bad_params_are_refused(record: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rule_from_json(record)


def test_sentence_and_paragraph_splitting() -> None:
    text = 'He said "stop." Then J. R. R. Tolkien left, i.e. fast! Pi is 3.14. Why?\n- a bullet\n***'
    assert sentences(text) == [
        'He said "stop."',
        "Then J. R. R. Tolkien left, i.e. fast!",
        "Pi is 3.14.",
        "Why?",
        "- a bullet\n***",
    ]
    assert sentences("") == [] and sentences("...\n***") == []
    assert paragraphs("\n***\na\nb\n  \n***\nc\n\n") == ["a\nb", "c"]
    assert paragraphs("a\n***\n\n***\nb") == ["a", "", "b"]
    assert paragraphs("***bold*** text\n\nmore") == ["***bold*** text\n\nmore"]
    assert blank_line_paragraphs("\n\na\nb\n  \n\nc\n") == ["a\nb", "c"]


def test_loose_accepts_a_leading_preamble_that_strict_refuses() -> None:
    rules = [
        rule_from_json({"name": "start_with_phrase", "params": {"phrase": "Dear team"}}),
        rule_from_json({"name": "no_commas"}),
        rule_from_json({"name": "all_lowercase"}),
    ]
    response = "Sure, here it is:\ndear team we ship today"
    assert check_rules(rules, response) == [False, False, False]
    assert check_rules(rules, response, mode="strict") == [False, False, False]
    assert check_rules(rules, response, mode="loose") == [True, True, True]
    quoted = [rule_from_json({"name": "quotation"})]
    assert check_rules(quoted, 'Sure, here it is:\n"we ship today"') == [False]
    assert check_rules(quoted, 'Sure, here it is:\n"we ship today"', mode="loose") == [True]


def test_loose_variants_follow_ifeval() -> None:
    response = "Sure:\n**Body** text\nHope this helps!"
    variants = loose_variants(response)
    assert variants[0] == response
    assert "**Body** text" in variants and "Body text" in variants
    assert "Sure:\nBody text" in variants and "Body text\nHope this helps!" in variants
    assert len(variants) == len(set(variants)) == 8
    assert loose_variants("one line") == ["one line"]  # removing its only line leaves nothing
    end = rule_from_json({"name": "end_with_phrase", "params": {"phrase": "Thanks."}})
    assert check_rules([end], "**Thanks.**") == [False]
    assert check_rules([end], "**Thanks.**", mode="loose") == [True]


def test_loose_still_refuses_what_no_variant_satisfies() -> None:
    rules: list[Rule] = [
        rule_from_json({"name": "word_count", "params": {"n": 10}}),
        rule_from_json({"name": "all_uppercase"}),
    ]
    assert check_rules(rules, "Sure:\nRED FOX\nbye", mode="loose") == [False, True]
    with pytest.raises(ValueError, match="unknown mode"):
        check_rules(rules, "x", mode="lenient")  # type: ignore[arg-type]

"""Every if rule checks a hostile completion in linear time.

A backtracking pattern (`^\\s*` under MULTILINE, `[.!?]+(?=\\s)`, `\\s*```$`) turned a 24,000-character
completion into seconds of regex work holding the GIL, freezing the reward front. Here each
registered rule checks the worst completions we could build for it (long runs of the characters
its patterns match, separators without their closers, abbreviations that keep a sentence open)
in strict and loose mode. The bound asserted is generous (a quadratic check takes tens of seconds
on these sizes); the test prints the slowest check so a regression shows before it fails.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from cascade.domains.if_rules import REGISTRY, check_rules, rule_from_json

pytestmark = pytest.mark.timeout(600)

N = 24_000
BOUND_S = 2.0
"""Per check, strict or loose (measured: a few milliseconds each; see the printed maximum)."""

PARAMS: dict[str, dict[str, Any]] = {
    "word_count": {"n": 3},
    "include_word": {"word": "fox"},
    "exclude_word": {"word": "fox"},
    "json_keys": {"keys": ["a"]},
    "bullet_count": {"n": 3},
    "start_with": {"word": "RED"},
    "end_with": {"word": "SUN"},
    "topic_words": {"words": ["red", "fox"]},
    "min_words": {"n": 3},
    "max_words": {"n": 3},
    "sentence_count": {"relation": "at most", "n": 3},
    "paragraph_count": {"n": 3},
    "keyword_frequency": {"word": "fox", "relation": "at least", "n": 2},
    "letter_frequency": {"letter": "a", "relation": "at least", "n": 2},
    "uppercase_word_frequency": {"relation": "at least", "n": 2},
    "lowercase_word_frequency": {"relation": "at least", "n": 2},
    "start_with_phrase": {"phrase": "Dear team"},
    "end_with_phrase": {"phrase": "Any other questions?"},
    "postscript": {"marker": "P.S."},
    "placeholder_count": {"n": 2},
    "highlight_count": {"n": 2},
    "section_count": {"splitter": "Section", "n": 2},
    "response_language": {"language": "en"},
    "markdown_bullets": {"n": 2},
    "paragraph_first_word": {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "fox"},
}


def hostile_completions() -> dict[str, str]:
    """Completions of about N characters built against the patterns rules use."""
    unit = {
        "newlines": "\n",
        "spaces": " ",
        "blank_lines": " \n",
        "bangs_no_space": "!",
        "dots": ".",
        "abbreviations": "e.g. ",
        "initials": "J. ",
        "word_apostrophes": "a'",
        "apostrophes": "'",
        "open_angles": "<<a",
        "open_brackets": "[",
        "open_brackets_text": "[a ",
        "stars": "*",
        "star_words": "*a ",
        "bold_opens": "**a ",
        "dividers": "***\n",
        "six_stars": "******",
        "ps_lines": "P.S.\n",
        "ps_no_newline": "P. S. ",
        "section_words": "Section ",
        "hash_lines": "## \n",
        "bullets": "- \n",
        "dashes": "-",
        "quotes": '"',
        "cjk": "\u4e00",
        "fullwidth_commas": "\uff0c",
        "digits": "9",
        "letters": "a",
        "json_open_arrays": "[",
    }
    out = {name: (piece * (N // len(piece) + 1))[:N] for name, piece in unit.items()}
    out["fence_then_spaces"] = "```" + " " * N + "x"
    out["json_nested"] = "[" * (N // 2) + "]" * (N // 2)
    out["json_spaces"] = "{" + " " * N + "}"
    out["ps_then_spaces"] = "P.S." + " " * N
    return out


def _rules() -> list[Any]:
    rules = []
    for name in sorted(REGISTRY):
        params = PARAMS.get(name, {})
        rules.append(rule_from_json({"name": name, "params": params}))
    return rules


def test_every_rule_has_params_for_the_timing() -> None:
    for name, cls in REGISTRY.items():
        assert set(cls.arguments) == set(PARAMS.get(name, {})), name


def test_every_rule_is_fast_on_hostile_completions() -> None:
    rules = _rules()
    rule_from_json({"name": "response_language", "params": {"language": "en"}}).check("warm up the profiles")
    slowest: tuple[float, str] = (0.0, "")
    for text_name, text in hostile_completions().items():
        for rule in rules:
            for mode in ("strict", "loose"):
                start = time.perf_counter()
                check_rules([rule], text, mode)  # type: ignore[arg-type]
                elapsed = time.perf_counter() - start
                slowest = max(slowest, (elapsed, f"{rule.name} on {text_name} ({mode})"))
                assert elapsed < BOUND_S, f"{rule.name} took {elapsed:.2f} s on {text_name} ({mode})"
    print(f"slowest check: {slowest[0] * 1000:.1f} ms, {slowest[1]}")

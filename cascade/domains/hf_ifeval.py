"""IFEval's `instruction_id_list` + `kwargs` -> our registered rules (`cascade.domains.if_rules`).

Each IFEval instruction id maps to one registered rule (or one per keyword for the keyword
lists), with IFEval's kwargs renamed to the rule's params. IFEval's strict "less than n" becomes
"at most n-1". Data sets stored as parquet give every kwargs dict every key (None where unused);
None values are dropped. An id with no mapping is `UnknownInstruction` (naming it), or, with
`unknown_instructions: skip`, an unconvertible row.

Every id of IFEval's registry is mapped. `change_case:english_capital` and `..._lowercase` check
the case and that the response is English (the instruction says "in English"), on the same text.
`combination:repeat_prompt` is `start_with_phrase` with the prompt to repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cascade.domains.if_rules import REGISTRY, rule_from_json, words


class UnknownInstruction(ValueError):
    """An IFEval instruction id with no registered rule."""


class UnusableRow(ValueError):
    """A row our rules cannot express (the `ifeval` adapter makes it `Unconvertible`: skipped
    and counted by the loader)."""


Kwargs = Mapping[str, Any]
Mapping_ = Callable[[Kwargs], list[tuple[str, dict[str, Any]]]]


def _relation(kwargs: Kwargs, key: str, count_key: str) -> tuple[str, int]:
    relation, n = str(kwargs[key]), int(kwargs[count_key])
    if relation == "less than":
        return "at most", n - 1
    if relation in ("at least", "at most", "exactly"):
        return relation, n
    raise ValueError(f"relation {relation!r}")


def _one(name: str, **renames: str) -> Mapping_:
    return lambda kw: [(name, {param: kw[key] for param, key in renames.items()})]


def _counted(name: str, relation_key: str, count_key: str, **renames: str) -> Mapping_:
    def build(kw: Kwargs) -> list[tuple[str, dict[str, Any]]]:
        relation, n = _relation(kw, relation_key, count_key)
        return [(name, {"relation": relation, "n": n} | {p: kw[k] for p, k in renames.items()})]

    return build


def _number_words(kw: Kwargs) -> list[tuple[str, dict[str, Any]]]:
    relation, n = _relation(kw, "relation", "num_words")
    if relation == "exactly":
        return [("word_count", {"n": n})]
    return [("min_words" if relation == "at least" else "max_words", {"n": n})]


def _each_word(name: str, key: str) -> Mapping_:
    def build(kw: Kwargs) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for word in kw[key]:
            if words(str(word)) != [str(word)]:
                raise ValueError(f"{key} entry {word!r} is not one word")
            out.append((name, {"word": str(word)}))
        return out

    return build


IFEVAL_RULES: dict[str, Mapping_] = {
    "punctuation:no_comma": _one("no_commas"),
    "length_constraints:number_words": _number_words,
    "length_constraints:number_sentences": _counted("sentence_count", "relation", "num_sentences"),
    "length_constraints:number_paragraphs": lambda kw: [
        ("paragraph_count", {"n": int(kw["num_paragraphs"])})
    ],
    "keywords:frequency": _counted("keyword_frequency", "relation", "frequency", word="keyword"),
    "keywords:letter_frequency": _counted(
        "letter_frequency", "let_relation", "let_frequency", letter="letter"
    ),
    "keywords:existence": _each_word("include_word", "keywords"),
    "keywords:forbidden_words": _each_word("exclude_word", "forbidden_words"),
    "change_case:english_capital": _one("english_uppercase"),
    "change_case:english_lowercase": _one("english_lowercase"),
    "language:response_language": _one("response_language", language="language"),
    "length_constraints:nth_paragraph_first_word": lambda kw: [
        (
            "paragraph_first_word",
            {
                "num_paragraphs": int(kw["num_paragraphs"]),
                "nth_paragraph": int(kw["nth_paragraph"]),
                "first_word": str(kw["first_word"]),
            },
        )
    ],
    "detectable_format:number_bullet_lists": lambda kw: [("markdown_bullets", {"n": int(kw["num_bullets"])})],
    "combination:repeat_prompt": _one("start_with_phrase", phrase="prompt_to_repeat"),
    "change_case:capital_word_frequency": _counted(
        "uppercase_word_frequency", "capital_relation", "capital_frequency"
    ),
    "startend:end_checker": _one("end_with_phrase", phrase="end_phrase"),
    "startend:quotation": _one("quotation"),
    "detectable_content:postscript": _one("postscript", marker="postscript_marker"),
    "detectable_content:number_placeholders": lambda kw: [
        ("placeholder_count", {"n": int(kw["num_placeholders"])})
    ],
    "detectable_format:title": _one("title"),
    "detectable_format:number_highlighted_sections": lambda kw: [
        ("highlight_count", {"n": int(kw["num_highlights"])})
    ],
    "detectable_format:multiple_sections": lambda kw: [
        ("section_count", {"splitter": str(kw["section_spliter"]), "n": int(kw["num_sections"])})
    ],
    "detectable_format:json_format": _one("json_format"),
    "detectable_format:constrained_response": _one("constrained_response"),
    "combination:two_responses": _one("two_responses"),
}


def rules_for(
    instruction_ids: list[Any], kwargs_list: list[Any], unknown: str = "error"
) -> list[dict[str, Any]]:
    """The rules (as stored in meta) for one IFEval row. An unmapped id raises
    `UnknownInstruction` (`unknown="error"`) or `UnusableRow` (`"skip"`); kwargs a rule
    rejects make the row `UnusableRow`."""
    if len(kwargs_list) != len(instruction_ids):
        raise UnusableRow(f"{len(instruction_ids)} instruction ids but {len(kwargs_list)} kwargs")
    rules: list[dict[str, Any]] = []
    for instruction, kwargs in zip(instruction_ids, kwargs_list, strict=True):
        build = IFEVAL_RULES.get(str(instruction))
        if build is None:
            message = (
                f"unknown IFEval instruction id {instruction!r}: no registered rule maps it "
                f"(set `unknown_instructions: skip` to drop such rows)"
            )
            raise UnknownInstruction(message) if unknown == "error" else UnusableRow(message)
        given = {k: v for k, v in dict(kwargs or {}).items() if v is not None}
        try:
            for name, params in build(given):
                assert name in REGISTRY, name
                rules.append(rule_from_json({"name": name, "params": params}).to_json())
        except (KeyError, ValueError, TypeError) as err:
            raise UnusableRow(f"{instruction}: bad kwargs {given}: {err}") from None
    if not rules:
        raise UnusableRow("no instructions")
    return rules

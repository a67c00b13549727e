"""Text units (sentences, paragraphs) and the count-with-relation rule they feed."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from cascade.domains.if_rules.core import WORD_RE, Rule

# --------------------------------------------------------------------------- text units

_SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d)\]]*(?=\s|$)")
_ABBREVIATIONS = frozenset(
    "e.g. i.e. etc. vs. cf. mr. mrs. ms. dr. prof. st. jr. sr. no. fig. approx. inc. ltd.".split()
)
_SEPARATOR_LINE = re.compile(r"^\s*(?:\*{3,}\s*)?$")


def sentences(text: str) -> list[str]:
    """Sentences of a response, split by regex (no NLTK).

    A sentence ends at a run of `.`, `!` or `?` (optionally followed by closing quotes or
    brackets) that is followed by whitespace or the end of the text, and at every line break.
    A full stop right after a known abbreviation (`e.g.`, `Dr.`, ...) or a single-letter initial
    does not end a sentence; a full stop inside a token (`3.14`, `a.b`) never does. Pieces with
    no word character (a lone `***` line, a bullet dash) are not sentences.
    """
    found: list[str] = []
    for line in text.splitlines():
        start = 0
        for match in _SENTENCE_END.finditer(line):
            tokens = line[start : match.start()].split()
            last = tokens[-1] if tokens else ""
            if match.group().startswith(".") and (
                last.lower() + "." in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())
            ):
                continue
            piece = line[start : match.end()].strip()
            if WORD_RE.search(piece):
                found.append(piece)
            start = match.end()
        rest = line[start:].strip()
        if WORD_RE.search(rest):
            found.append(rest)
    return found


def paragraphs(text: str) -> list[str]:
    """Paragraphs: maximal runs of lines between separator lines (blank, or `***` markdown dividers).

    Several separator lines in a row count as one separator (no empty paragraphs).
    """
    found: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if _SEPARATOR_LINE.match(line):
            if current:
                found.append("\n".join(current))
                current = []
        else:
            current.append(line)
    if current:
        found.append("\n".join(current))
    return found


Relation = Literal["at least", "at most", "exactly"]
RELATIONS: tuple[str, ...] = ("at least", "at most", "exactly")


def compare(count: int, relation: str, n: int) -> bool:
    """`count` <relation> `n`, for relation in RELATIONS."""
    if relation == "at least":
        return count >= n
    if relation == "at most":
        return count <= n
    if relation == "exactly":
        return count == n
    raise ValueError(f"unknown relation {relation!r}; expected one of {RELATIONS}")


def _squash(text: str) -> str:
    """Lowercased, whitespace runs collapsed to one space, ends stripped."""
    return " ".join(text.split()).lower()


class _CountRule(Rule):
    """A rule comparing a count with `n` under `relation` ("at least", "at most", "exactly"):
    the `relation` param when the rule takes one, else the rule's fixed `default_relation`."""

    default_relation: ClassVar[str] = "at least"

    def validate(self) -> None:
        if self.params["n"] < 0:
            raise ValueError(f"rule {self.name!r}: n must be >= 0, got {self.params['n']}")
        if "relation" in self.params and self.params["relation"] not in RELATIONS:
            raise ValueError(
                f"rule {self.name!r}: relation must be one of {RELATIONS}, got {self.params['relation']!r}"
            )

    def count(self, response: str) -> int:
        raise NotImplementedError

    def check(self, response: str) -> bool:
        return compare(
            self.count(response), self.params.get("relation", self.default_relation), self.params["n"]
        )


def _require_text(rule: Rule, key: str) -> None:
    if not rule.params[key].strip():
        raise ValueError(f"rule {rule.name!r}: {key} must not be empty")

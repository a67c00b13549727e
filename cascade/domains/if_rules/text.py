"""Text units (sentences, paragraphs) and the count-with-relation rule they feed."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from cascade.domains.if_rules.core import WORD_RE, Rule

# --------------------------------------------------------------------------- text units

_TOKEN = re.compile(r"\S+")
_CLOSERS = "\"'\u201d\u2019)]}*_"
_OPENERS = "\"'\u201c\u2018([{*_"
_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf mr mrs ms dr prof st jr sr fig approx inc ltd co corp u.s u.k a.m p.m ph.d".split()
)
"""Full stops that do not end a sentence. Words that are also names or plain words (`Jan.`,
`Sun.`, `No.`) are left out: "We sat in the sun. It was warm." is two sentences."""


def _ends_sentence(token: str) -> bool:
    """Whether a whitespace-separated token closes a sentence: it ends in `.`, `!` or `?` (closing
    quotes and brackets may follow), and a full stop is not that of an abbreviation, a capital
    initial or an ellipsis."""
    core = token.rstrip(_CLOSERS)
    if not core or core[-1] not in ".!?":
        return False
    if core[-1] != ".":
        return True
    if core.endswith(".."):
        return False  # an ellipsis trails off; Punkt does not end the sentence there
    stem = core[:-1].lstrip(_OPENERS)
    return not (stem.lower() in _ABBREVIATIONS or (len(stem) == 1 and stem.isupper()))


def sentences(text: str) -> list[str]:
    """Sentences of a response, split as Punkt (the splitter IFEval counts with) splits them, by a
    linear scan of whitespace-separated tokens, no model.

    A sentence ends with a token ending in `.`, `!` or `?` (closing quotes or brackets may
    follow it); a full stop inside a token (`3.14`, `a.b`) never ends one, nor does that of a
    known abbreviation (`e.g.`, `Dr.`, ...) or of a capital initial (`J.`; a lowercase `a.` does
    end one) or of an ellipsis (`...`). Line breaks are
    not sentence ends (a list of unpunctuated bullets is one sentence, as Punkt counts it).
    Text after the last end is a sentence if it has a word; pieces with no word character are not
    sentences.
    """
    found: list[str] = []
    start = None
    for match in _TOKEN.finditer(text):
        if start is None:
            start = match.start()
        if _ends_sentence(match.group()):
            piece = text[start : match.end()]
            if WORD_RE.search(piece):
                found.append(piece)
            start = None
    if start is not None and WORD_RE.search(text, start):
        found.append(text[start:].strip())
    return found


def _is_divider(line: str) -> bool:
    """A markdown divider line: three to five `*` and nothing else but blanks. Six (`******`) is
    IFEval's separator of two responses (combination:two_responses), not of paragraphs."""
    stripped = line.strip()
    return 3 <= len(stripped) <= 5 and stripped.strip("*") == ""


def paragraphs(text: str) -> list[str]:
    """Paragraphs as IFEval's "separated by the markdown divider `***`" means them: the text between
    divider lines (see `_is_divider`). Blank lines do not separate paragraphs. Leading and
    trailing empty pieces are dropped; an empty piece between two dividers is kept (as "")."""
    pieces: list[list[str]] = [[]]
    for line in text.splitlines():
        if _is_divider(line):
            pieces.append([])
        else:
            pieces[-1].append(line)
    found = ["\n".join(lines).strip() for lines in pieces]
    while found and not found[0]:
        found.pop(0)
    while found and not found[-1]:
        found.pop()
    return found


def blank_line_paragraphs(text: str) -> list[str]:
    """Paragraphs separated by blank lines (IFEval's "separated by two new lines" for the nth
    paragraph's first word); blank paragraphs are dropped."""
    found: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            found.append("\n".join(current).strip())
            current = []
    if current:
        found.append("\n".join(current).strip())
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

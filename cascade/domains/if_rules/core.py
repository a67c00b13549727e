"""The rule base class, the registry, words, and strict/loose checking."""

from __future__ import annotations

import re
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

WORD_RE = re.compile(r"\w+(?:['\u2019]\w+)*")
"""A word: a run of Unicode letters, digits or `_` (`\\w`, as IFEval counts), with apostrophes
inside it (`don't` is one word; IFEval's `\\w+` makes it two)."""
_POSSESSIVE = re.compile(r"['\u2019]s$")
BULLET_RE = re.compile(r"-\s+\S")
"""A `- ` bullet, matched at a line's first non-blank character (no `^\\s*`: linear on any line)."""


def words(text: str) -> list[str]:
    """Words of a response (see WORD_RE; punctuation and bullets are not words). The text is
    NFC-normalised first, so a letter written with a combining accent (`cafe\u0301`) stays one word."""
    return WORD_RE.findall(unicodedata.normalize("NFC", text))


def word_key(word: str) -> str:
    """The form a word is matched by: lowercased, a possessive `'s` dropped (`Bad's` -> `bad`)."""
    return _POSSESSIVE.sub("", word.lower())


def word_keys(text: str) -> list[str]:
    """`word_key` of every word of `text`."""
    return [word_key(w) for w in words(text)]


_WORD_JOINERS = re.compile(r"['\u2019_]")


def _parts(word: str) -> list[str]:
    return _WORD_JOINERS.split(word.lower())


def mentions_word(text: str, word: str) -> bool:
    """Whether `word` is written in `text`, read the way a forbidden word is: case-insensitive, as
    a whole word or as a whole part of a word joined by apostrophes or `_` (`bad's`, `bad'd`,
    `bad've`, `bad_stuff`, `_bad_` all write `bad`; `badge` does not). IFEval's reference
    (`\bbad\b`) finds the apostrophe forms; it misses the `_` forms, since `_` is a word character
    to `\b`: here a word hidden in an identifier is still written."""
    target = _parts(word)
    size = len(target)
    for candidate in words(text):
        parts = _parts(candidate)
        if any(parts[i : i + size] == target for i in range(len(parts) - size + 1)):
            return True
    return False


def is_blank(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace and invisible format characters (Unicode
    category Cf: zero-width space and joiners, word joiner, byte-order mark, soft hyphen...), which
    `str.strip` keeps. A reply of `\u200b` says nothing, like an empty one."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def is_bulleted(line: str) -> bool:
    """Whether `line` is a `- ` bullet (leading blanks allowed)."""
    return BULLET_RE.match(line.lstrip()) is not None


class Rule(ABC):
    """One verifiable instruction."""

    name: ClassVar[str]
    gate: ClassVar[bool] = False
    """A gate rule (the toy domain's topic) voids every other rule when it fails: the reply earns 0
    in every reward mode, since instructions followed by a reply that ignores the task count for nothing."""
    template: ClassVar[str]
    """Sentence stated in the prompt, formatted with the params."""
    description: ClassVar[str]
    """What the check verifies, for people reading the registry (not shown in prompts)."""
    arguments: ClassVar[dict[str, type]]
    """The params the rule takes, each with its JSON type (int, str or list)."""

    def __init__(self, **params: Any) -> None:
        _check_params(type(self), params)
        self.params = params
        self.validate()

    def validate(self) -> None:
        """Check param values beyond their types; raise ValueError on a bad one."""
        return None

    def describe(self) -> str:
        return self.template.format(**self.params)

    @abstractmethod
    def check(self, response: str) -> bool: ...

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


def _check_params(cls: type[Rule], params: dict[str, Any]) -> None:
    expected = cls.arguments
    missing = sorted(set(expected) - set(params))
    unknown = sorted(set(params) - set(expected))
    if missing or unknown:
        raise ValueError(
            f"rule {cls.name!r}: missing param(s) {missing}, unknown param(s) {unknown}; "
            f"expected {sorted(expected)}"
        )
    for key, kind in expected.items():
        value = params[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"rule {cls.name!r}: param {key!r} must be {kind.__name__}, got {value!r:.60}")


REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    if cls.name in REGISTRY:
        raise ValueError(f"rule {cls.name!r} registered twice")
    for attr in ("template", "description", "arguments"):
        if not hasattr(cls, attr):
            raise ValueError(f"rule {cls.name!r} has no {attr}")
    REGISTRY[cls.name] = cls
    return cls


def registry_spec() -> list[dict[str, Any]]:
    """Every registered rule: name, description, arguments (name -> type name) and prompt template."""
    return [
        {
            "name": name,
            "description": cls.description,
            "arguments": {key: kind.__name__ for key, kind in cls.arguments.items()},
            "template": cls.template,
        }
        for name, cls in sorted(REGISTRY.items())
    ]


def rule_from_json(record: dict[str, Any]) -> Rule:
    name = record.get("name")
    if name not in REGISTRY:
        raise ValueError(f"unknown instruction rule {name!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[name](**record.get("params", {}))


# --------------------------------------------------------------------------- strict and loose checks

CheckMode = Literal["strict", "loose"]


def loose_variants(response: str) -> list[str]:
    """IFEval's loose variants, built as its reference builds them: the response with the first,
    last or both lines removed (each then stripped), and each of the four with `*` removed
    afterwards; blank variants dropped, duplicates removed (order kept)."""
    lines = response.split("\n")
    cut = [
        response,
        "\n".join(lines[1:]).strip(),
        "\n".join(lines[:-1]).strip(),
        "\n".join(lines[1:-1]).strip(),
    ]
    variants: list[str] = []
    for candidate in cut + [text.replace("*", "") for text in cut]:
        if not is_blank(candidate) and candidate not in variants:
            variants.append(candidate)
    return variants


def check_rules(rules: Sequence[Rule], response: str, mode: CheckMode = "strict") -> list[bool]:
    """Whether each rule holds: on `response` itself (`strict`) or on any loose variant (`loose`).

    A blank response (`is_blank`: nothing but whitespace and invisible format characters) follows
    no instruction in either mode (as IFEval: "no commas" or "fewer than 5 sentences" is not
    followed by saying nothing).
    (Not `cascade.domains.instruct.check_rules`, which names the broken rules, strictly.)
    """
    if mode not in ("strict", "loose"):
        raise ValueError(f"unknown mode {mode!r}; expected 'strict' or 'loose'")
    if is_blank(response):
        return [False for _ in rules]
    if mode == "strict":
        return [rule.check(response) for rule in rules]
    if mode == "loose":
        variants = loose_variants(response)
        return [any(rule.check(v) for v in variants) for rule in rules]
    raise ValueError(f"unknown mode {mode!r}; expected 'strict' or 'loose'")

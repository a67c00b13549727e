"""Instruction checkers in the IFEval style: each a small registered rule with params.

A rule is stored in a problem's meta as `{"name": ..., "params": {...}}`; `rule_from_json`
rebuilds it, `describe()` gives the sentence the prompt states, `check(response)` the verdict.
New rules register with `@register`.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

_WORD = re.compile(r"[A-Za-z0-9']+")
_BULLET = re.compile(r"^\s*-\s+\S")


def words(text: str) -> list[str]:
    """Words of a response (letters, digits, apostrophes; punctuation and bullets are not words)."""
    return _WORD.findall(text)


class Rule(ABC):
    """One verifiable instruction."""

    name: ClassVar[str]
    template: ClassVar[str]
    """Sentence stated in the prompt, formatted with the params."""

    def __init__(self, **params: Any) -> None:
        self.params = params

    def describe(self) -> str:
        return self.template.format(**self.params)

    @abstractmethod
    def check(self, response: str) -> bool: ...

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    if cls.name in REGISTRY:
        raise ValueError(f"rule {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def rule_from_json(record: dict[str, Any]) -> Rule:
    name = record.get("name")
    if name not in REGISTRY:
        raise ValueError(f"unknown instruction rule {name!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[name](**record.get("params", {}))


@register
class AllUppercase(Rule):
    name = "all_uppercase"
    template = "All caps."

    def check(self, response: str) -> bool:
        return any(c.isalpha() for c in response) and response == response.upper()


@register
class AllLowercase(Rule):
    name = "all_lowercase"
    template = "All lowercase."

    def check(self, response: str) -> bool:
        return any(c.isalpha() for c in response) and response == response.lower()


@register
class WordCount(Rule):
    name = "word_count"
    template = "Exactly {n} words."

    def check(self, response: str) -> bool:
        return len(words(response)) == self.params["n"]


@register
class IncludeWord(Rule):
    name = "include_word"
    template = "Use {word}."

    def check(self, response: str) -> bool:
        return self.params["word"].lower() in (w.lower() for w in words(response))


@register
class ExcludeWord(Rule):
    name = "exclude_word"
    template = "Avoid {word}."

    def check(self, response: str) -> bool:
        return self.params["word"].lower() not in (w.lower() for w in words(response))


@register
class JsonKeys(Rule):
    name = "json_keys"
    template = "JSON with key {keys_text}."

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.keys_text = " and ".join(params["keys"])

    def describe(self) -> str:
        return self.template.format(keys_text=self.keys_text)

    def check(self, response: str) -> bool:
        text = response.strip()
        if text.startswith("```"):
            text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text)
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return isinstance(value, dict) and all(key in value for key in self.params["keys"])


@register
class BulletCount(Rule):
    name = "bullet_count"
    template = "{n} bullets."

    def check(self, response: str) -> bool:
        lines = [line for line in response.splitlines() if line.strip()]
        bullets = [line for line in lines if _BULLET.match(line)]
        return len(bullets) == self.params["n"] and len(bullets) == len(lines)


@register
class StartWith(Rule):
    name = "start_with"
    template = "Start with {word}."

    def check(self, response: str) -> bool:
        found = words(response)
        return bool(found) and found[0] == self.params["word"]


@register
class EndWith(Rule):
    name = "end_with"
    template = "End with {word}."

    def check(self, response: str) -> bool:
        found = words(response)
        return bool(found) and found[-1] == self.params["word"]


@register
class NoCommas(Rule):
    name = "no_commas"
    template = "No commas."

    def check(self, response: str) -> bool:
        return "," not in response

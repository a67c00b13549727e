"""The ten rules the toy `if` domain states in its prompts (case, counts, words, JSON...)."""

from __future__ import annotations

import json
import re
from typing import Any

from cascade.domains.if_rules.core import BULLET_RE, Rule, register, words


@register
class AllUppercase(Rule):
    name = "all_uppercase"
    template = "All caps."
    description = "Every letter is uppercase (and there is at least one letter)."
    arguments = {}

    def check(self, response: str) -> bool:
        return any(c.isalpha() for c in response) and response == response.upper()


@register
class AllLowercase(Rule):
    name = "all_lowercase"
    template = "All lowercase."
    description = "Every letter is lowercase (and there is at least one letter)."
    arguments = {}

    def check(self, response: str) -> bool:
        return any(c.isalpha() for c in response) and response == response.lower()


@register
class WordCount(Rule):
    name = "word_count"
    template = "Exactly {n} words."
    description = "Exactly `n` words."
    arguments = {"n": int}

    def check(self, response: str) -> bool:
        return len(words(response)) == self.params["n"]


@register
class IncludeWord(Rule):
    name = "include_word"
    template = "Use {word}."
    description = "`word` appears as a whole word (case-insensitive)."
    arguments = {"word": str}

    def check(self, response: str) -> bool:
        return self.params["word"].lower() in (w.lower() for w in words(response))


@register
class ExcludeWord(Rule):
    name = "exclude_word"
    template = "Avoid {word}."
    description = "`word` does not appear as a whole word (case-insensitive)."
    arguments = {"word": str}

    def check(self, response: str) -> bool:
        return self.params["word"].lower() not in (w.lower() for w in words(response))


@register
class JsonKeys(Rule):
    name = "json_keys"
    template = "JSON with key {keys_text}."
    description = "The response (optionally in a ```json fence) is a JSON object with every key of `keys`."
    arguments = {"keys": list}

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
    description = "Exactly `n` non-blank lines, every one a `- ` bullet."
    arguments = {"n": int}

    def check(self, response: str) -> bool:
        lines = [line for line in response.splitlines() if line.strip()]
        bullets = [line for line in lines if BULLET_RE.match(line)]
        return len(bullets) == self.params["n"] and len(bullets) == len(lines)


@register
class StartWith(Rule):
    name = "start_with"
    template = "Start with {word}."
    description = "The first word is exactly `word` (case-sensitive)."
    arguments = {"word": str}

    def check(self, response: str) -> bool:
        found = words(response)
        return bool(found) and found[0] == self.params["word"]


@register
class EndWith(Rule):
    name = "end_with"
    template = "End with {word}."
    description = "The last word is exactly `word` (case-sensitive)."
    arguments = {"word": str}

    def check(self, response: str) -> bool:
        found = words(response)
        return bool(found) and found[-1] == self.params["word"]


@register
class NoCommas(Rule):
    name = "no_commas"
    template = "No commas."
    description = "No comma anywhere."
    arguments = {}

    def check(self, response: str) -> bool:
        return "," not in response

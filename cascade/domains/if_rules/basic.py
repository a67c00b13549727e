"""The rules the toy `if` domain states in its prompts (topic, case, counts, words, JSON...)."""

from __future__ import annotations

import json
from typing import Any

from cascade.domains.if_rules.core import Rule, is_bulleted, mentions_word, register, word_keys, words


def _is_cased(char: str) -> bool:
    return char.lower() != char.upper()


def all_letters_cased(text: str) -> bool:
    """Whether every letter of `text` has a case: a caseless script (Chinese, Japanese kana,
    Arabic, ...) is neither all capitals nor all lowercase."""
    return all(_is_cased(c) for c in text if c.isalpha())


def load_json(text: str) -> tuple[bool, Any]:
    """(ok, value) of a whole response as JSON, optionally in a markdown fence, the fence read as
    IFEval reads it: the stripped text loses a leading ```` ```json ````, ```` ```Json ````,
    ```` ```JSON ```` and ```` ``` ```` (each in turn) and a trailing ```` ``` ````. Nesting too
    deep for the parser is not JSON (never an exception)."""
    text = text.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        text = text.removeprefix(fence)
    text = text.removesuffix("```").strip()
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        return False, None


@register
class TopicWords(Rule):
    """The toy domain's task itself: restate the given words. A gate: a reply that ignores them
    earns nothing for following the format rules (an empty template, a JSON object with no
    words, a list of other words)."""

    name = "topic_words"
    gate = True
    template = "Words: {words_text}."
    description = (
        "Every word of `words` appears as a whole word (any case, possessive allowed), and they make "
        "up at least half of the reply's words (no stuffing the reply with other words)."
    )
    arguments = {"words": list}

    def validate(self) -> None:
        given = self.params["words"]
        if not given or not all(isinstance(w, str) and words(w) == [w] for w in given):
            raise ValueError(f"rule {self.name!r}: words must be a non-empty list of single words")

    def describe(self) -> str:
        return self.template.format(words_text=" ".join(self.params["words"]))

    def check(self, response: str) -> bool:
        keys = word_keys(response)
        wanted = {w.lower() for w in self.params["words"]}
        on_topic = sum(1 for k in keys if k in wanted)
        return wanted <= set(keys) and 2 * on_topic >= len(keys)


@register
class AllUppercase(Rule):
    name = "all_uppercase"
    template = "All caps."
    description = (
        "Every letter is a capital letter: at least one, and none lowercase or of a caseless "
        "script (`str.isupper`, as IFEval, plus no caseless letters)."
    )
    arguments = {}

    def check(self, response: str) -> bool:
        return response.isupper() and all_letters_cased(response)


@register
class AllLowercase(Rule):
    name = "all_lowercase"
    template = "All lowercase."
    description = (
        "Every letter is a lowercase letter: at least one, and none uppercase or of a caseless "
        "script (`str.islower`, as IFEval, plus no caseless letters)."
    )
    arguments = {}

    def check(self, response: str) -> bool:
        return response.islower() and all_letters_cased(response)


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
    description = "`word` appears as a whole word (case-insensitive; a possessive `word's` counts)."
    arguments = {"word": str}

    def check(self, response: str) -> bool:
        return self.params["word"].lower() in word_keys(response)


@register
class ExcludeWord(Rule):
    name = "exclude_word"
    template = "Avoid {word}."
    description = (
        "`word` does not appear as a whole word, case-insensitive, nor as a whole part of a word "
        "joined by apostrophes or `_` (`word's`, `word'd`, `word_x`): `mentions_word`."
    )
    arguments = {"word": str}

    def check(self, response: str) -> bool:
        return not mentions_word(response, self.params["word"])


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
        ok, value = load_json(response)
        return ok and isinstance(value, dict) and all(key in value for key in self.params["keys"])


@register
class BulletCount(Rule):
    name = "bullet_count"
    template = "{n} bullets."
    description = "Exactly `n` non-blank lines, every one a `- ` bullet."
    arguments = {"n": int}

    def check(self, response: str) -> bool:
        lines = [line for line in response.splitlines() if line.strip()]
        bullets = [line for line in lines if is_bulleted(line)]
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


COMMAS = (",", "\uff0c", "\u3001", "\ufe50", "\u060c")


@register
class NoCommas(Rule):
    name = "no_commas"
    template = "No commas."
    description = "No comma anywhere (nor a full-width, ideographic or Arabic comma)."
    arguments = {}

    def check(self, response: str) -> bool:
        return not any(comma in response for comma in COMMAS)

"""Instruction checkers in the IFEval style: each a small registered rule with params.

A rule is stored in a problem's meta as `{"name": ..., "params": {...}}`; `rule_from_json`
rebuilds it, `describe()` gives the sentence the prompt states, `check(response)` the verdict.
Every rule class also states what it checks (`description`) and the params it takes
(`arguments`: name -> type); params are checked against `arguments` on construction (a missing,
unknown or mistyped param raises ValueError). New rules register with `@register`;
`registry_spec()` lists them all.

Every check is language-free and download-free: words are `[A-Za-z0-9']+` runs, sentences are
split by a regex (see `sentences`), paragraphs by blank or `***` lines (see `paragraphs`).

`check_rules(rules, response, mode)` checks a response in IFEval's two modes: `strict` checks
the response as given; `loose` also accepts a rule if it holds on any non-empty variant of the
response with the first line, the last line or both removed, each with and without markdown
asterisks (`*`) stripped (8 variants in all, as in IFEval's loose accuracy). The instruct
domain's own scoring is unchanged (strict).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

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
        bullets = [line for line in lines if _BULLET.match(line)]
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
            if _WORD.search(piece):
                found.append(piece)
            start = match.end()
        rest = line[start:].strip()
        if _WORD.search(rest):
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


# --------------------------------------------------------------------------- length


@register
class MinWords(_CountRule):
    name = "min_words"
    template = "Use at least {n} words."
    description = "At least `n` words."
    arguments = {"n": int}

    def count(self, response: str) -> int:
        return len(words(response))


@register
class MaxWords(_CountRule):
    name = "max_words"
    template = "Use at most {n} words."
    description = "At most `n` words."
    arguments = {"n": int}

    default_relation = "at most"

    def count(self, response: str) -> int:
        return len(words(response))


@register
class SentenceCount(_CountRule):
    name = "sentence_count"
    template = "Answer in {relation} {n} sentences."
    description = "The number of sentences (see `sentences`) is `relation` `n`."
    arguments = {"relation": str, "n": int}

    def count(self, response: str) -> int:
        return len(sentences(response))


@register
class ParagraphCount(_CountRule):
    name = "paragraph_count"
    template = "Write exactly {n} paragraphs, separated by blank lines or the markdown divider ***."
    description = "Exactly `n` paragraphs, separated by blank lines or `***` lines (see `paragraphs`)."
    arguments = {"n": int}

    default_relation = "exactly"

    def count(self, response: str) -> int:
        return len(paragraphs(response))


# --------------------------------------------------------------------------- frequencies


@register
class KeywordFrequency(_CountRule):
    name = "keyword_frequency"
    template = "Use the word {word} {relation} {n} times."
    description = "Whole-word, case-insensitive occurrences of `word` are `relation` `n`."
    arguments = {"word": str, "relation": str, "n": int}

    def validate(self) -> None:
        super().validate()
        if not _WORD.fullmatch(self.params["word"]):
            raise ValueError(f"rule {self.name!r}: word must be one word, got {self.params['word']!r}")

    def count(self, response: str) -> int:
        target = self.params["word"].lower()
        return sum(1 for w in words(response) if w.lower() == target)


@register
class LetterFrequency(_CountRule):
    name = "letter_frequency"
    template = "Use the letter {letter} {relation} {n} times."
    description = "Case-insensitive occurrences of the single letter `letter` are `relation` `n`."
    arguments = {"letter": str, "relation": str, "n": int}

    def validate(self) -> None:
        super().validate()
        letter = self.params["letter"]
        if len(letter) != 1 or not letter.isalpha():
            raise ValueError(f"rule {self.name!r}: letter must be one letter, got {letter!r}")

    def count(self, response: str) -> int:
        return response.lower().count(self.params["letter"].lower())


@register
class UppercaseWordFrequency(_CountRule):
    name = "uppercase_word_frequency"
    template = "Use {relation} {n} words in all capital letters."
    description = "Words (see `words`) whose letters are all uppercase (`str.isupper`) are `relation` `n`."
    arguments = {"relation": str, "n": int}

    def count(self, response: str) -> int:
        return sum(1 for w in words(response) if w.isupper())


@register
class LowercaseWordFrequency(_CountRule):
    name = "lowercase_word_frequency"
    template = "Use {relation} {n} words in all lowercase letters."
    description = "Words (see `words`) whose letters are all lowercase (`str.islower`) are `relation` `n`."
    arguments = {"relation": str, "n": int}

    def count(self, response: str) -> int:
        return sum(1 for w in words(response) if w.islower())


# --------------------------------------------------------------------------- start and end


@register
class StartWithPhrase(Rule):
    name = "start_with_phrase"
    template = "Start your response with the phrase: {phrase}"
    description = "The response starts with `phrase` (case-insensitive, whitespace runs collapsed)."
    arguments = {"phrase": str}

    def validate(self) -> None:
        _require_text(self, "phrase")

    def check(self, response: str) -> bool:
        return _squash(response).startswith(_squash(self.params["phrase"]))


@register
class EndWithPhrase(Rule):
    name = "end_with_phrase"
    template = "End your response with the exact phrase: {phrase} No other words should follow it."
    description = "The response ends with `phrase` (case-insensitive, whitespace runs collapsed)."
    arguments = {"phrase": str}

    def validate(self) -> None:
        _require_text(self, "phrase")

    def check(self, response: str) -> bool:
        return _squash(response).endswith(_squash(self.params["phrase"]))


@register
class Quotation(Rule):
    name = "quotation"
    template = "Wrap your entire response in double quotation marks."
    description = 'The stripped response starts and ends with a double quote ("..." or \u201c...\u201d).'
    arguments = {}

    def check(self, response: str) -> bool:
        text = response.strip()
        return len(text) > 1 and (
            (text[0] == '"' and text[-1] == '"') or (text[0] == "\u201c" and text[-1] == "\u201d")
        )


@register
class Postscript(Rule):
    name = "postscript"
    template = "At the end of your response, add a postscript starting with {marker}"
    description = (
        "A line starts with `marker` (case-insensitive; a space may follow each full stop, so "
        "`P. S.` counts for `P.S.`) and some text follows it."
    )
    arguments = {"marker": str}

    def validate(self) -> None:
        _require_text(self, "marker")

    def check(self, response: str) -> bool:
        parts = [re.escape(c) + (r"\s?" if c == "." else "") for c in self.params["marker"].strip()]
        pattern = re.compile(r"^\s*" + "".join(parts) + r".*\S", re.IGNORECASE | re.MULTILINE)
        return pattern.search(response) is not None


# --------------------------------------------------------------------------- markup

_TITLE = re.compile(r"<<([^\n<>]+)>>")
_PLACEHOLDER = re.compile(r"\[([^\[\]\n]+)\]")
_BOLD = re.compile(r"\*\*([^\n*]+)\*\*")
_ITALIC = re.compile(r"(?<!\*)\*([^\n*]+)\*(?!\*)")


@register
class Title(Rule):
    name = "title"
    template = "Include a title wrapped in double angular brackets, such as <<poem of joy>>."
    description = "Contains a non-blank title on one line in double angle brackets: `<<title>>`."
    arguments = {}

    def check(self, response: str) -> bool:
        return any(title.strip() for title in _TITLE.findall(response))


@register
class PlaceholderCount(_CountRule):
    name = "placeholder_count"
    template = "Include at least {n} placeholders in square brackets, such as [address]."
    description = "At least `n` non-blank placeholders on one line in square brackets: `[name]`."
    arguments = {"n": int}

    def count(self, response: str) -> int:
        return sum(1 for inner in _PLACEHOLDER.findall(response) if inner.strip())


@register
class HighlightCount(_CountRule):
    name = "highlight_count"
    template = "Highlight at least {n} sections with markdown, such as *highlighted section*."
    description = "At least `n` non-blank one-line highlights, `*text*` or `**text**` (each counted once)."
    arguments = {"n": int}

    def count(self, response: str) -> int:
        found = _BOLD.findall(response) + _ITALIC.findall(_BOLD.sub("", response))
        return sum(1 for inner in found if inner.strip())


@register
class SectionCount(_CountRule):
    name = "section_count"
    template = "Your response must have {n} sections; start each with {splitter} X, where X is its number."
    description = "At least `n` lines start with `splitter` then a number (e.g. `Section 1`)."
    arguments = {"splitter": str, "n": int}

    def validate(self) -> None:
        super().validate()
        _require_text(self, "splitter")

    def count(self, response: str) -> int:
        pattern = re.compile(r"^\s*" + re.escape(self.params["splitter"].strip()) + r"\s+\d+", re.MULTILINE)
        return len(pattern.findall(response))


# --------------------------------------------------------------------------- whole-response formats

_JSON_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)
CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


@register
class JsonFormat(Rule):
    name = "json_format"
    template = "Wrap your entire output in JSON format."
    description = "The whole response (optionally in a ```json fence) is valid JSON."
    arguments = {}

    def check(self, response: str) -> bool:
        text = _JSON_FENCE.sub("", response.strip())
        try:
            json.loads(text)
        except ValueError:
            return False
        return True


@register
class TwoResponses(Rule):
    name = "two_responses"
    template = "Give two different responses, separated by six asterisks: ******"
    description = "Exactly two non-blank, different parts separated by `******`."
    arguments = {}

    def check(self, response: str) -> bool:
        parts = [part.strip() for part in response.split("******")]
        return len(parts) == 2 and all(parts) and parts[0] != parts[1]


@register
class ConstrainedResponse(Rule):
    name = "constrained_response"
    template = "Answer with one of: My answer is yes. / My answer is no. / My answer is maybe."
    description = "Contains one of the fixed options `My answer is yes.`, `... no.`, `... maybe.`."
    arguments = {}

    def check(self, response: str) -> bool:
        return any(option in response for option in CONSTRAINED_OPTIONS)


# --------------------------------------------------------------------------- strict and loose checks

CheckMode = Literal["strict", "loose"]


def loose_variants(response: str) -> list[str]:
    """IFEval's loose variants: the response with the first, last or both lines removed, each with
    and without `*` stripped; blank variants dropped, duplicates removed (order kept)."""
    variants: list[str] = []
    for text in (response, response.replace("*", "")):
        lines = text.split("\n")
        for candidate in (
            text,
            "\n".join(lines[1:]).strip(),
            "\n".join(lines[:-1]).strip(),
            "\n".join(lines[1:-1]).strip(),
        ):
            if candidate.strip() and candidate not in variants:
                variants.append(candidate)
    return variants


def check_rules(rules: Sequence[Rule], response: str, mode: CheckMode = "strict") -> list[bool]:
    """Whether each rule holds: on `response` itself (`strict`) or on any loose variant (`loose`).

    (Not `cascade.domains.instruct.check_rules`, which names the broken rules, strictly.)
    """
    if mode == "strict":
        return [rule.check(response) for rule in rules]
    if mode == "loose":
        variants = loose_variants(response)
        return [any(rule.check(v) for v in variants) for rule in rules]
    raise ValueError(f"unknown mode {mode!r}; expected 'strict' or 'loose'")

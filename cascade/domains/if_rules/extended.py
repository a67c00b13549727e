"""IFEval-style rules beyond the toy domain's ten: lengths, frequencies, phrases, markup, formats."""

from __future__ import annotations

import json
import re

from cascade.domains.if_rules.core import WORD_RE, Rule, register, words
from cascade.domains.if_rules.text import _CountRule, _require_text, _squash, paragraphs, sentences

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
        if not WORD_RE.fullmatch(self.params["word"]):
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

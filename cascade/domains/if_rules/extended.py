"""IFEval-style rules beyond the toy domain's ten: lengths, frequencies, phrases, markup, formats."""

from __future__ import annotations

import re
from typing import Any

from cascade.domains.if_rules.basic import AllLowercase, AllUppercase, load_json
from cascade.domains.if_rules.core import WORD_RE, Rule, register, word_keys, words
from cascade.domains.if_rules.text import (
    _CountRule,
    _require_text,
    _squash,
    blank_line_paragraphs,
    paragraphs,
    sentences,
)

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
    template = "Write exactly {n} paragraphs, separated by the markdown divider ***."
    description = (
        "Exactly `n` non-empty paragraphs, separated by `***` divider lines (see `paragraphs`; "
        "blank lines do not separate them, an empty paragraph between two dividers fails)."
    )
    arguments = {"n": int}

    default_relation = "exactly"

    def count(self, response: str) -> int:
        found = paragraphs(response)
        return len(found) if all(found) else -1


# --------------------------------------------------------------------------- frequencies


@register
class KeywordFrequency(_CountRule):
    name = "keyword_frequency"
    template = "Use the word {word} {relation} {n} times."
    description = (
        "Whole-word, case-insensitive occurrences of `word` (possessives included) are `relation` `n`."
    )
    arguments = {"word": str, "relation": str, "n": int}

    def validate(self) -> None:
        super().validate()
        if not WORD_RE.fullmatch(self.params["word"]):
            raise ValueError(f"rule {self.name!r}: word must be one word, got {self.params['word']!r}")

    def count(self, response: str) -> int:
        target = self.params["word"].lower()
        return sum(1 for key in word_keys(response) if key == target)


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


_CASED_WORD = re.compile(r"\w+(?:[-.'\u2019]\w+)*")
"""A word for counting capitals: hyphens, inner full stops and apostrophes join (`WELL-KNOWN`,
`U.S.`, `DON'T` are one word each, as NLTK's tokenizer keeps the first two)."""


def cased_words(text: str) -> list[str]:
    """Words as `_CASED_WORD` finds them, possessive `'s` dropped (`NASA's` -> `NASA`)."""
    return [w[:-2] if w[-2:].lower() in ("'s", "\u2019s") else w for w in _CASED_WORD.findall(text)]


@register
class UppercaseWordFrequency(_CountRule):
    name = "uppercase_word_frequency"
    template = "Use {relation} {n} words in all capital letters."
    description = "Words (see `cased_words`) all in capitals (`str.isupper`) are `relation` `n`."
    arguments = {"relation": str, "n": int}

    def count(self, response: str) -> int:
        return sum(1 for w in cased_words(response) if w.isupper())


@register
class LowercaseWordFrequency(_CountRule):
    name = "lowercase_word_frequency"
    template = "Use {relation} {n} words in all lowercase letters."
    description = "Words (see `cased_words`) all in lowercase (`str.islower`) are `relation` `n`."
    arguments = {"relation": str, "n": int}

    def count(self, response: str) -> int:
        return sum(1 for w in cased_words(response) if w.islower())


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
    description = (
        "The response ends with `phrase` (case-insensitive, whitespace runs collapsed; double quotes "
        "around the whole response are ignored, as IFEval ignores them)."
    )
    arguments = {"phrase": str}

    def validate(self) -> None:
        _require_text(self, "phrase")

    def check(self, response: str) -> bool:
        return _squash(response.strip().strip(_DOUBLE_QUOTES)).endswith(_squash(self.params["phrase"]))


_DOUBLE_QUOTES = '"\u201c\u201d'


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


_MARKDOWN_LEAD = "#*_> \t"


@register
class Postscript(Rule):
    name = "postscript"
    template = "At the end of your response, add a postscript starting with {marker}"
    description = (
        "`marker` is written (case-insensitive; whitespace may follow each full stop, so `P. S.` "
        "counts for `P.S.`; anywhere, as IFEval finds it: at a line's start, after markdown, or "
        "inline) and some text follows it. A marker inside a word (`lap.s.`) or the tail of a longer "
        "one (`P.S.` in `P.P.S.`) is not the postscript asked for, nor is a bare marker with no text."
    )
    arguments = {"marker": str}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        parts = [re.escape(c) + (r"\s?" if c == "." else "") for c in self.params["marker"].strip()]
        self._marker = re.compile("".join(parts), re.IGNORECASE)

    def validate(self) -> None:
        _require_text(self, "marker")

    def check(self, response: str) -> bool:
        last_word = len(response.rstrip()) - 1
        while last_word >= 0 and not (response[last_word].isalnum() or response[last_word] == "_"):
            last_word -= 1
        for found in self._marker.finditer(response):
            start = found.start()
            before = response[max(0, start - 3) : start].lower().replace(" ", "")
            inside_word = start > 0 and (response[start - 1].isalnum() or response[start - 1] == "_")
            if inside_word or before.endswith("p."):
                continue
            if last_word >= found.end():
                return True
        return False


# --------------------------------------------------------------------------- markup

_PLACEHOLDER = re.compile(r"\[([^\[\]\n]+)\]")
_BOLD = re.compile(r"\*\*([^\n*]+)\*\*")
_ITALIC = re.compile(r"(?<!\*)\*([^\n*]+)\*(?!\*)")


@register
class Title(Rule):
    name = "title"
    template = "Include a title wrapped in double angular brackets, such as <<poem of joy>>."
    description = (
        "Contains a non-blank title on one line in double angle brackets: `<<title>>` (markup inside "
        "it counts: `<<**Title**>>`, `<<a <b> c>>`), read as IFEval reads it: on each line, from the "
        "first `<<` to the last `>>`, with the brackets stripped."
    )
    arguments = {}

    def check(self, response: str) -> bool:
        return any(_title_on(line) for line in response.split("\n"))


def _title_on(line: str) -> bool:
    """IFEval's greedy `<<[^\\n]+>>` on one line, in linear time: the span from its first `<<` to
    its last `>>` (at least one character between), `<`s and `>`s stripped from its ends."""
    start, end = line.find("<<"), line.rfind(">>")
    return start >= 0 and end > start + 2 and bool(line[start : end + 2].lstrip("<").rstrip(">").strip())


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
    description = (
        "At least `n` lines start with `splitter` then a number (`Section 1`; case-sensitive; a "
        "markdown heading or emphasis may precede it: `## Section 1`, `**Section 1**`)."
    )
    arguments = {"splitter": str, "n": int}

    def validate(self) -> None:
        super().validate()
        _require_text(self, "splitter")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._start = re.compile(re.escape(self.params["splitter"].strip()) + r" ?\d+")

    def count(self, response: str) -> int:
        return sum(1 for line in response.splitlines() if self._start.match(line.lstrip(_MARKDOWN_LEAD)))


# --------------------------------------------------------------------------- whole-response formats

CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
_OPTION_NAMED = re.compile(r"\bmy\s+answer\s+is\s+(yes|no|maybe)\b", re.IGNORECASE)
"""An option named in any case or punctuation (`MY ANSWER IS NO!`): a second one voids the answer."""


@register
class JsonFormat(Rule):
    name = "json_format"
    template = "Wrap your entire output in JSON format."
    description = "The whole response (optionally in a ```json fence) is valid JSON."
    arguments = {}

    def check(self, response: str) -> bool:
        return load_json(response)[0]


@register
class TwoResponses(Rule):
    name = "two_responses"
    template = "Give two different responses, separated by six asterisks: ******"
    description = (
        "Exactly two non-blank, different parts separated by `******` (blank pieces before the "
        "first or after the last separator are ignored, a blank one between two is not)."
    )
    arguments = {}

    def check(self, response: str) -> bool:
        parts = [part.strip() for part in response.split("******")]
        while parts and not parts[0]:
            parts.pop(0)
        while parts and not parts[-1]:
            parts.pop()
        return len(parts) == 2 and all(parts) and parts[0] != parts[1]


@register
class ConstrainedResponse(Rule):
    name = "constrained_response"
    template = "Answer with one of: My answer is yes. / My answer is no. / My answer is maybe."
    description = (
        "Contains exactly one of the fixed options `My answer is yes.`, `... no.`, `... maybe.` "
        "(repeating it is fine; naming two or all of them answers nothing, in whatever case or "
        "punctuation the other one is written: `My answer is yes. My answer is no!` fails)."
    )
    arguments = {}

    def check(self, response: str) -> bool:
        given = {option for option in CONSTRAINED_OPTIONS if option in response}
        named = {m.group(1).lower() for m in _OPTION_NAMED.finditer(response)}
        return len(given) == 1 and len(named) == 1


# --------------------------------------------------------------------------- language, bullets, nth paragraph


@register
class ResponseLanguage(Rule):
    name = "response_language"
    template = "Your entire response should be in the language with ISO 639-1 code {language}."
    description = (
        "`langdetect` (seeded, so the verdict is the same every time) names `language` as the "
        "language of every part of the response (consecutive windows of 2,000+ characters covering "
        "all of it). A response with nothing to detect (no letters) is in no language."
    )
    arguments = {"language": str}

    def validate(self) -> None:
        _require_text(self, "language")

    def check(self, response: str) -> bool:
        from cascade.domains.if_rules.language import in_language

        return in_language(response, self.params["language"])


@register
class EnglishUppercase(AllUppercase):
    name = "english_uppercase"
    template = "Your entire response should be in English, and in all capital letters."
    description = (
        "`all_uppercase` and, on the same text, `response_language` `en` (IFEval's english_capital)."
    )

    def check(self, response: str) -> bool:
        from cascade.domains.if_rules.language import in_language

        return super().check(response) and in_language(response, "en")


@register
class EnglishLowercase(AllLowercase):
    name = "english_lowercase"
    template = "Your entire response should be in English, and in all lowercase letters."
    description = (
        "`all_lowercase` and, on the same text, `response_language` `en` (IFEval's english_lowercase)."
    )

    def check(self, response: str) -> bool:
        from cascade.domains.if_rules.language import in_language

        return super().check(response) and in_language(response, "en")


@register
class MarkdownBullets(_CountRule):
    name = "markdown_bullets"
    template = "Your answer must contain exactly {n} bullet points, in markdown: * like this."
    description = (
        "Exactly `n` lines are markdown bullets (`* ` or `- ` then text, any indent, as IFEval's "
        "bullets; a `+ ` line is not counted, as IFEval does not count it); other lines may surround "
        "them. A `---` rule, a `*emphasis*` line, `-5` or an empty bullet is not a bullet."
    )
    arguments = {"n": int}

    default_relation = "exactly"

    def count(self, response: str) -> int:
        return sum(1 for line in response.splitlines() if _is_markdown_bullet(line))


def _is_markdown_bullet(line: str) -> bool:
    body = line.lstrip()
    return len(body) > 2 and body[0] in "*-" and body[1] in " \t" and not body[2:].isspace()


@register
class ParagraphFirstWord(Rule):
    name = "paragraph_first_word"
    template = (
        "There should be {num_paragraphs} paragraphs, separated by blank lines. Paragraph "
        "{nth_paragraph} must start with the word {first_word}."
    )
    description = (
        "Exactly `num_paragraphs` paragraphs separated by blank lines (see "
        "`blank_line_paragraphs`), and the first word of paragraph `nth_paragraph` (1-based) is "
        "`first_word` (case-insensitive; read from the paragraph's first token as IFEval reads it, "
        "see `_first_word`; markdown and quotes before it ignored)."
    )
    arguments = {"num_paragraphs": int, "nth_paragraph": int, "first_word": str}

    def validate(self) -> None:
        n, nth = self.params["num_paragraphs"], self.params["nth_paragraph"]
        if not 1 <= nth <= n:
            raise ValueError(f"rule {self.name!r}: need 1 <= nth_paragraph <= num_paragraphs, got {nth}, {n}")
        if len(words(self.params["first_word"])) != 1:
            raise ValueError(f"rule {self.name!r}: first_word must be one word")

    def check(self, response: str) -> bool:
        found = blank_line_paragraphs(response)
        if len(found) != self.params["num_paragraphs"]:
            return False
        tokens = found[self.params["nth_paragraph"] - 1].split()
        return bool(tokens) and _first_word(tokens[0]) == self.params["first_word"].lower()


_FIRST_WORD_LEAD = "#*_>\"'\u201c\u2018"
_FIRST_WORD_END = ".,?!'\"\u2019\u201d*_"


def _first_word(token: str) -> str:
    """A paragraph's first word as IFEval reads it from its first whitespace-separated token:
    leading quotes (and here markdown marks) dropped, cut at the first `.`, `,`, `?`, `!` or quote
    (and here a closing markdown mark), lowercased: `"Sea,` and `**Sea's**` read `sea`, `sea-like`
    does not."""
    word = token.lstrip(_FIRST_WORD_LEAD)
    for index, char in enumerate(word):
        if char in _FIRST_WORD_END:
            word = word[:index]
            break
    return word.lower()

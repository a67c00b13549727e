"""Math notation rewritten into what math-verify reads right, before it parses a gold or an answer.

math-verify misreads some notations a grader accepts (a repeating decimal as its integer part,
`3√2` as 3, `1\\,000\\,000` as 1*0*0, `\\text{85}` as a word) and extracts undelimited LaTeX as
plain numbers (`the answer is 3\\sqrt{2}` as 3). These rewrites give it the math as written; none
evaluates anything, so what the answer leaves unevaluated is still judged as such
(`math_closed_form`).
"""

from __future__ import annotations

import re

_REPEATING = re.compile(r"(-?)(\d*)\.(\d*)\\overline\s*\{(\d{1,30})\}")
"""A repeating decimal `0.1\\overline{6}`, which math-verify reads as its integer part."""


def _repeating_as_fraction(match: re.Match[str]) -> str:
    sign, whole, fixed, period = match.groups()
    # x = whole.fixed(period)... = (whole fixed period - whole fixed) / (10^len(fixed) (10^len(period) - 1))
    head = int(whole + fixed or "0")
    numerator = int(whole + fixed + period) - head
    denominator = 10 ** len(fixed) * (10 ** len(period) - 1)
    return f"{sign}\\frac{{{numerator}}}{{{denominator}}}"


def normalise_notation(text: str) -> str:
    """Rewrite notation math-verify misreads into one it reads right (gold and answer alike):

    - repeating decimals become fractions (`0.\\overline{3}` -> `\\frac{3}{9}`, not 0);
    - a dollar sign in text mode (`\\text{\\$}42`) the plain `\\$` (not a product with 42);
    - unicode math its LaTeX (`3√2` -> `3\\sqrt{2}`, `x²` -> `x^{2}`, `π`, `∞`, `−`, `·`, `×`, `÷`, `±`),
      which math-verify reads as plain text (`3√2` as 3);
    - a number in text mode its math (`\\text{85}` -> `{85}`, `\\mathrm{47+38}` -> `{47+38}`:
      as text, the first would never equal 85 and the second would escape the closed-form guard);
    - thin-space thousands separators dropped (`1\\,000\\,000`, else read as 1*0*0);
    - a number's trailing decimal point dropped where math ends (`\\boxed{85.}` -> `\\boxed{85}`,
      which math-verify cannot parse);
    - scientific notation with a bare ten written with its exponent (`8.5\\times 10` ->
      `8.5\\times10^{1}`, else read as a product of two numbers).
    """
    if "overline" in text:
        text = _REPEATING.sub(_repeating_as_fraction, text)
    if "\\text" in text:
        text = _TEXT_DOLLAR.sub(r"\\$", text)
    if not text.isascii():
        text = _unicode_math(text)
    if "\\text" in text or "\\math" in text or "\\mbox" in text or "\\operatorname" in text:
        text = _TEXT_NUMBER.sub(r"{\1}", text)
    if any(sep in text for sep in ("\\,", "\\;", "\\:", "\\ ", "{,}")):
        text = _THIN_THOUSANDS.sub(lambda m: _THIN_SEPARATOR.sub("", m.group()), text)
    if "." in text:
        text = _TRAILING_POINT.sub("", text)
        if "10" in text:
            text = _BARE_TEN.sub(r"\1\2 10^{1}", text)
    return text


_UNICODE = {
    "π": "\\pi ",
    "∞": "\\infty ",
    "−": "-",
    "·": "\\cdot ",
    "⋅": "\\cdot ",
    "×": "\\times ",
    "÷": "\\div ",
    "±": "\\pm ",
}
_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPTS = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+")
_RADICAL = re.compile(r"([√∛∜])\s*(\([^()]*\)|\{[^{}]*\}|\d+(?:\.\d+)?|\\[A-Za-z]+|[A-Za-z])")
_ROOT_INDEX = {"√": "", "∛": "[3]", "∜": "[4]"}


def _unicode_math(text: str) -> str:
    def radical(match: re.Match[str]) -> str:
        body = match.group(2)
        if body[0] in "({":
            body = body[1:-1]
        return f"\\sqrt{_ROOT_INDEX[match.group(1)]}{{{body}}}"

    text = _RADICAL.sub(radical, text)
    text = _SUPERSCRIPTS.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPT) + "}", text)
    for char, latex in _UNICODE.items():
        text = text.replace(char, latex)
    return text


_TEXT_NUMBER = re.compile(
    r"\\(?:text|textrm|textbf|textnormal|mathrm|mathbf|mbox|operatorname)\s*"
    r"\{([-+*/=^.,()\s\d]*\d[-+*/=^.,()\s\d]*)\}"
)
"""Text-mode wrappers around nothing but numbers and arithmetic (`\\text{85}`, `\\mathrm{47+38}`)."""
_THIN_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:\\[,;: ]\s*|\{,\})\d{3})+(?![\d])")
"""`1\\,000\\,000`, `1\\;000`, `1{,}000`: digit groups of three separated by a LaTeX space."""
_THIN_SEPARATOR = re.compile(r"\\[,;: ]\s*|\{,\}")


_TRAILING_POINT = re.compile(r"(?<=\d)\.(?=\s*(?:[}$,)\]]|\\[)\]}]))")
"""A decimal point with no digits after it, at the end of a group, an element or the math
(`85.}`, `85.$`, `(1., 2.)`)."""
_BARE_TEN = re.compile(r"((?<![\d.])[1-9]\.\d+\s*)(\\times|\\cdot)\s*10(?![\d.^])")
"""Scientific notation whose power of ten is a bare 10 (`8.5\\times 10`, one digit before the point)."""


_TEXT_DOLLAR = re.compile(r"\\text(?:rm)?\s*\{\s*\\\$\s*\}")


_LATEX_CANDIDATE = re.compile(r"(?<!\S)\S*?(?:\\[A-Za-z]|\^)\S*")
"""A whole word holding a LaTeX command or a superscript (a subscript alone does not make a word
LaTeX: `x_1`, `total_sum` are as often identifiers in prose as math)."""
_LATEX_WORD = re.compile(r"[-+*/=^_.,()\[\]{}\d]*[A-Za-z]?(?:\\[A-Za-z]+|\^)[-+*/=^_.,()\[\]{}\\A-Za-z\d]*")
"""A word that is LaTeX: a command or a superscript, with math around it (`3\\sqrt{2}`, `x^2`)."""
_MATH_WORD = re.compile(r"[-+*/=]|-?\(?\d+(?:\.\d+)?\)?")
"""A word that joins a LaTeX run beside it: an operator or a number (`2 \\sqrt{3}`, `1 + \\pi`)."""
_TRAILING = ".,;:!?"
_MAX_RUNS = 100
"""Only the last runs are delimited (math-verify reads an answer from the end of a response)."""


def delimit_inline_math(response: str) -> str:
    """Put `$...$` around each run of LaTeX in a response that delimits none of its math.

    math-verify extracts undelimited text as plain numbers and operators, so `the answer is
    3\\sqrt{2}` would be read as 3 (and pass against a gold of 3): delimited, the run is read as
    the math it is. A run is a LaTeX word (with a command or `^`) and the numbers, operators
    and LaTeX words next to it, up to the end of a sentence; trailing punctuation stays outside.
    """
    if "\\" not in response and "^" not in response:
        return response
    candidates = [
        m for m in _LATEX_CANDIDATE.finditer(response) if _LATEX_WORD.fullmatch(m.group().rstrip(_TRAILING))
    ]
    runs: list[tuple[int, int]] = []
    for candidate in candidates[-_MAX_RUNS:]:
        start, end = candidate.span()
        if runs and start < runs[-1][1]:
            continue  # already inside the previous run
        floor = runs[-1][1] if runs else 0
        while (word := _word_before(response, start, floor)) and _MATH_WORD.fullmatch(response[slice(*word)]):
            start = word[0]
        while response[end - 1] not in _TRAILING and (word := _word_after(response, end)):
            text = response[slice(*word)]
            text = text.rstrip(_TRAILING)
            if not (_MATH_WORD.fullmatch(text) or _LATEX_WORD.fullmatch(text)):
                break
            end = word[1]
        while end > start and response[end - 1] in _TRAILING:
            end -= 1
        runs.append(_strip_operators(response, start, end))
    pieces, pos = [], 0
    for start, end in runs:
        pieces += [response[pos:start], "$", response[start:end], "$"]
        pos = end
    return "".join(pieces) + response[pos:]


def _word_before(text: str, i: int, floor: int) -> tuple[int, int] | None:
    j = i
    while j > floor and text[j - 1].isspace():
        j -= 1
    k = j
    while k > floor and not text[k - 1].isspace():
        k -= 1
    return (k, j) if k < j and (k == 0 or text[k - 1].isspace()) else None


def _word_after(text: str, i: int) -> tuple[int, int] | None:
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    k = j
    while k < len(text) and not text[k].isspace():
        k += 1
    return (j, k) if j < k else None


def _strip_operators(text: str, start: int, end: int) -> tuple[int, int]:
    """A run without the lone operators at its edges (`= 3\\sqrt{2}` -> `3\\sqrt{2}`)."""
    run = text[start:end]
    stripped = run.strip()
    while len(stripped) > 1 and stripped[0] in "+-*/=" and stripped[1].isspace():
        stripped = stripped[1:].lstrip()
    while len(stripped) > 1 and stripped[-1] in "+-*/=" and stripped[-2].isspace():
        stripped = stripped[:-1].rstrip()
    offset = start + run.index(stripped)
    return offset, offset + len(stripped)

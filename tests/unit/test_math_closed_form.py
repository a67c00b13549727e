"""The math verifier's closed-form rule and notation rewrites, as hand-written tables.

`check_answer(gold, completion)` is what the worker processes run; every row goes through it,
so the rule is tested as scoring applies it (parse, guard, verify). The rule itself is stated
in cascade/domains/math_closed_form.py; corpus_math.py holds the hostile versions.
"""

from __future__ import annotations

import logging

import pytest

from cascade.domains.base import OK, WRONG_ANSWER
from cascade.domains.math import check_answer
from cascade.domains.math_notation import delimit_inline_math, normalise_notation

NOT_CLOSED = "not a closed form"

# (gold, answer, expected reason, expected text in the detail)
TABLE: list[tuple[str, str, str, str]] = [
    # -- the problem's arithmetic, however it is grouped or spaced: not a closed form
    ("85", "\\boxed{47+38}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{\\left(47+38\\right)}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{[47+38]}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{47\\,+\\,38}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{47 \\quad + 38}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{\\displaystyle 47+38}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{\\mathrm{47+38}}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{\\text{47+38}}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "47 + 38", WRONG_ANSWER, NOT_CLOSED),
    ("18", "\\boxed{30\u221212}", WRONG_ANSWER, NOT_CLOSED),
    ("1786", "The answer is 47 \u00d7 38", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{85 = 47+38}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{\\{47+38\\}}", WRONG_ANSWER, NOT_CLOSED),
    ("85", "\\boxed{\\lim_{x\\to0}(47+38)}", WRONG_ANSWER, "limit"),
    ("85", "\\boxed{\\sum_{i=1}^{1} 85}", WRONG_ANSWER, "sum"),
    ("85", "\\boxed{\\int_0^1 85\\,dx}", WRONG_ANSWER, "integral"),
    ("85", "\\boxed{\\frac{d}{dx}(85x)}", WRONG_ANSWER, "derivative"),
    ("85", "\\boxed{85\\cdot 1}", WRONG_ANSWER, "product"),
    ("85", "\\boxed{47+38+0}", WRONG_ANSWER, "sum"),
    ("85", "\\boxed{85^{1}}", WRONG_ANSWER, "power"),
    ("85", "\\boxed{|{-85}|}", WRONG_ANSWER, "Abs"),
    ("85", "\\boxed{\\lfloor 85.5 \\rfloor}", WRONG_ANSWER, "floor"),
    ("85", "\\boxed{85+\\sin 0}", WRONG_ANSWER, "sin"),
    ("2", "\\boxed{\\log_{10} 100}", WRONG_ANSWER, "log"),
    ("85", "\\boxed{\\sqrt{7225}}", WRONG_ANSWER, "root"),
    ("1024", "\\boxed{2^{10}}", WRONG_ANSWER, "power"),
    ("5/6", "\\boxed{\\frac{1}{2}+\\frac{1}{3}}", WRONG_ANSWER, "sum"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{2}+\\sqrt{2}}", WRONG_ANSWER, "sum"),
    ("2", "\\boxed{\\sqrt{2}\\cdot\\sqrt{2}}", WRONG_ANSWER, "product"),
    ("2x", "\\boxed{x+x}", WRONG_ANSWER, "sum"),
    ("85", "\\boxed{47 - (\\sqrt{2} - 38) + \\sqrt{2}}", WRONG_ANSWER, "sum"),
    ("85", "\\boxed{47 - (x - 38) + x}", WRONG_ANSWER, "sum"),
    ("85", "\\boxed{47 + 38(\\sin^2 x + \\cos^2 x)}", WRONG_ANSWER, "\\sin"),
    ("85", "\\boxed{47 + 38\\cdot 1^x}", WRONG_ANSWER, "variable"),
    ("85", "\\boxed{\\frac{170x}{2x}}", WRONG_ANSWER, "variable"),
    ("85", "\\boxed{\\begin{pmatrix}47+38\\end{pmatrix}}", WRONG_ANSWER, "sum"),
    ("85", "\\boxed{47 + 38 (\\sqrt{2})^2 / 2}", WRONG_ANSWER, "value is a number"),
    ("85", "\\boxed{47 + 38\\cos(2\\pi)}", WRONG_ANSWER, "\\cos"),
    ("85", "\\boxed{47 + 38(1+\\sqrt{2})(\\sqrt{2}-1)}", WRONG_ANSWER, "value is a number"),
    ("4", "\\boxed{\\sqrt{2}\\sqrt{8}}", WRONG_ANSWER, "value is a number"),
    ("3", "\\boxed{\\lfloor\\pi\\rfloor}", WRONG_ANSWER, "floor"),
    ("85", "\\boxed{9^{9^{9^{9^{9}}}}}", WRONG_ANSWER, "power"),
    # -- folded by the parser while reading (the tree is just 85): refused on the written form
    ("85", "\\boxed{\\gcd(47+38)}", WRONG_ANSWER, "\\gcd"),
    ("85", "\\boxed{\\operatorname{lcm}(47+38,1)}", WRONG_ANSWER, "lcm"),
    ("85", "\\boxed{\\det\\begin{pmatrix}47&-38\\\\1&1\\end{pmatrix}}", WRONG_ANSWER, "determinant"),
    ("85", "\\boxed{\\begin{vmatrix}47&-38\\\\1&1\\end{vmatrix}}", WRONG_ANSWER, "determinant"),
    ("85", "\\boxed{47\\frac{38}{1}}", WRONG_ANSWER, "mixed number"),
    ("85", "\\boxed{47 \\dfrac{76}{2}}", WRONG_ANSWER, "mixed number"),
    ("85", "\\boxed{\\tbinom{85}{1}}", WRONG_ANSWER, "binom"),
    ("85", "\\boxed{e^{\\ln 85}}", WRONG_ANSWER, "\\ln"),
    ("85", "\\boxed{\\max(85)}", WRONG_ANSWER, "\\max"),
    ("85", "\\boxed{{47}+{38}}", WRONG_ANSWER, "a sum of numbers"),
    ("85", "\\boxed{170\\div 2}", WRONG_ANSWER, "quotient"),
    ("85", "\\boxed{" + "{" * 100 + "85" + "}" * 100 + "}", WRONG_ANSWER, "nested too deep"),
    # -- forms of the value: closed forms, right
    ("85", "\\boxed{85}", OK, ""),
    ("85", "\\boxed{85.0}", OK, ""),
    ("85", "\\boxed{--85}", OK, ""),
    ("85", "\\boxed{-(-85)}", OK, ""),
    ("85", "\\boxed{\\frac{170}{2}}", OK, ""),
    ("85", "\\boxed{8.5\\times10^1}", OK, ""),
    ("85", "\\boxed{\\text{85}}", OK, ""),
    ("85", "\\boxed{85\\text{ apples}}", OK, ""),
    ("85", "\\boxed{47+38=85}", OK, ""),
    ("85", "\\boxed{x=85}", OK, ""),
    ("85", "\\boxed{85\\%}", OK, ""),
    ("-7", "\\boxed{\u22127}", OK, ""),
    ("2", "\\boxed{\\frac{4}{2}}", OK, ""),
    ("1", "\\boxed{0.\\overline{9}}", OK, ""),
    ("1000000", "\\boxed{10^6}", OK, ""),
    ("85", "\\boxed{85.}", OK, ""),
    ("85", "$85.$", OK, ""),
    ("85", "\\boxed{8.5\\times 10}", OK, ""),
    ("85", "\\boxed{8.5\\cdot 10}", OK, ""),
    ("85", "\\boxed{8.5 \\times 10^{1}}", OK, ""),
    ("(1,2)", "\\boxed{(1., 2.)}", OK, ""),
    ("\\frac{7}{2}", "\\boxed{3\\frac{1}{2}}", OK, ""),
    ("\\frac{3\\sqrt{2}}{2}", "\\boxed{3\\sqrt{2}/2}", OK, ""),
    ("1000000", "\\boxed{1\\,000\\,000}", OK, ""),
    ("2000000", "2\u00d710\u2076", OK, ""),
    ("0.0015", "\\boxed{1.5\\times 10^{-3}}", OK, ""),
    ("3\\sqrt{2}", "\\boxed{3\\sqrt{2}}", OK, ""),
    ("3\\sqrt{2}", "\\boxed{\\sqrt{18}}", OK, ""),
    ("3\\sqrt{2}", "The length is 3\u221a2.", OK, ""),
    ("3\\sqrt{2}", "So the answer is 3\\sqrt{2}.", OK, ""),
    ("-2\\sqrt{3}", "\\boxed{-2\\sqrt{3}}", OK, ""),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{2\\sqrt{3}}{4}}", OK, ""),
    ("\\frac{1+\\sqrt{5}}{2}", "\\boxed{\\frac{1}{2}+\\frac{\\sqrt{5}}{2}}", OK, ""),
    ("\\frac{\\pi}{4}", "\\boxed{\\pi/4}", OK, ""),
    ("\\frac{\\pi}{4}", "\\boxed{\u03c0/4}", OK, ""),
    ("x^2+2x+1", "\\boxed{(x+1)^2}", OK, ""),
    ("49", "\\boxed{7\u00b2}", WRONG_ANSWER, "power"),
    ("(1,2)", "\\boxed{(1,2)}", OK, ""),
    ("x^2-1", "\\boxed{(x+1)(x-1)}", OK, ""),
    ("3+2\\sqrt{2}", "\\boxed{(1+\\sqrt{2})^2}", OK, ""),
    ("1.5", "The answer is 3/2", OK, ""),
    ("-1.5", "The answer is -3/2", OK, ""),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}", OK, ""),
    ("1", "\\boxed{100\\%}", OK, ""),
    ("x^2+x", "\\boxed{x(x+1)}", OK, ""),
    ("[0,\\infty)", "\\boxed{x \\ge 0}", OK, ""),
    ("\\text{Monday}", "\\boxed{\\text{Monday}}", OK, ""),
    ("[0,\\infty)", "\\boxed{[0, \\infty)}", OK, ""),
    # -- a gold written in a form the rule calls unevaluated allows that same form
    ("2^{10}", "\\boxed{2^{10}}", OK, ""),
    ("2^{10}", "\\boxed{1024}", OK, ""),
    ("2^{10}", "\\boxed{2^5\\cdot 2^5}", WRONG_ANSWER, NOT_CLOSED),
    ("\\sqrt{4}", "\\boxed{\\sqrt{4}}", OK, ""),
    ("1\\frac{1}{2}", "\\boxed{1\\frac12}", OK, ""),
    ("\\log_2 3", "\\boxed{\\log_{2} 3}", OK, ""),
    ("\\binom{10}{3}", "\\boxed{\\binom{10}{3}}", OK, ""),
    ("\\binom{10}{3}", "\\boxed{\\binom{10}{3} + 0}", WRONG_ANSWER, NOT_CLOSED),
    # -- radicals are read whole, boxed or not: 3 times a radical is not 3
    ("3", "3\u221a2", WRONG_ANSWER, "got"),
    ("3", "So the answer is 3\\sqrt{2}.", WRONG_ANSWER, "got"),
    ("3", "the answer: 3 \\sqrt{2}", WRONG_ANSWER, "got"),
    ("3", "\\boxed{3\\sqrt{2}}", WRONG_ANSWER, "got"),
]


@pytest.fixture(autouse=True, scope="module")
def _quiet() -> None:
    logging.getLogger("math_verify").setLevel(logging.ERROR)


@pytest.mark.parametrize(
    ("gold", "answer", "reason", "detail"), TABLE, ids=[f"{g}|{a}" for g, a, *_ in TABLE]
)
def test_closed_form_table(gold: str, answer: str, reason: str, detail: str) -> None:
    got_reason, got_detail = check_answer(gold, answer, 5.0)
    assert (got_reason, detail in got_detail) == (reason, True), got_detail


@pytest.mark.parametrize(
    ("text", "rewritten"),
    [
        ("3\u221a2", "3\\sqrt{2}"),
        ("\u221a(x+1)", "\\sqrt{x+1}"),
        ("\u221b8", "\\sqrt[3]{8}"),
        ("x\u00b2 + y\u207b\u00b9", "x^{2} + y^{-1}"),
        ("2\u03c0", "2\\pi "),
        ("30\u221212", "30-12"),
        ("\\text{85}", "{85}"),
        ("\\mathrm{47+38}", "{47+38}"),
        ("5\\text{ cm}", "5\\text{ cm}"),
        ("1\\,000\\,000", "1000000"),
        ("1{,}000", "1000"),
        ("47\\,+\\,38", "47\\,+\\,38"),
        ("0.1\\overline{6}", "\\frac{15}{90}"),
        ("\\boxed{85.}", "\\boxed{85}"),
        ("$(1., 2.)$", "$(1, 2)$"),
        ("The answer is 85. Then", "The answer is 85. Then"),
        ("8.5\\times 10", "8.5\\times 10^{1}"),
        ("8.5\\times 100", "8.5\\times 100"),
        ("18.5\\times 10", "18.5\\times 10"),
    ],
)
def test_notation_is_rewritten_as_math_verify_reads_it(text: str, rewritten: str) -> None:
    assert normalise_notation(text) == rewritten


@pytest.mark.parametrize(
    ("response", "delimited"),
    [
        ("So the answer is 3\\sqrt{2}.", "So the answer is $3\\sqrt{2}$."),
        ("The answer is 2 \\sqrt{3} units", "The answer is $2 \\sqrt{3}$ units"),
        ("Since \\sqrt{4} = 2, we get 85", "Since $\\sqrt{4} = 2$, we get 85"),
        ("a^2 + b^2 = c^2 so c = 5", "$a^2 + b^2 = c^2$ so c = 5"),
        ("= \\frac{1}{2} =", "= $\\frac{1}{2}$ ="),
        ("just 85, no LaTeX", "just 85, no LaTeX"),
        ("x = 12, where x_1 is the first guess", "x = 12, where x_1 is the first guess"),
    ],
)
def test_undelimited_latex_is_delimited(response: str, delimited: str) -> None:
    assert delimit_inline_math(response) == delimited


def test_delimiting_is_bounded_on_huge_responses() -> None:
    """A megabyte of LaTeX words is delimited in one pass (only the last runs wrapped)."""
    response = "x^2 blah " * 100_000 + "so 3\\sqrt{2}"
    out = delimit_inline_math(response)
    assert out.endswith("so $3\\sqrt{2}$") and out.count("$") == 200

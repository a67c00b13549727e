"""Reward hacking, math, generated rather than listed: for a synthetic problem `a+b` or `a-b`
(`draw_math_problem` makes no other arithmetic), every restatement of its expression through an
operator or function the parser knows earns 0, and every equivalent written form of the value
earns 1. Scored through `MathDomain.score_batch`, as training scores them.

Derandomized, so `make test` sees the same examples every run; the budget is small by default
and scaled by `CASCADE_HYPOTHESIS_SCALE` for a longer run (`make test-properties`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_budget import examples

from cascade.config import MathReward
from cascade.domains.base import OK, Problem
from cascade.domains.math import MathDomain

EXAMPLES = examples(25)

Template = Callable[[int, int, str], str]
"""(a, b, operator) -> the boxed content of a completion."""


def _expr(a: int, b: int, op: str) -> str:
    return f"{a}{op}{b}"


def _value(a: int, b: int, op: str) -> int:
    return a + b if op == "+" else a - b


def _det(a: int, b: int, op: str, env: str) -> str:
    """A 2x2 matrix whose determinant is a+b (a·1 - (-b)·1) or a-b."""
    other = -b if op == "+" else b
    return f"\\begin{{{env}}}{a}&{other}\\\\1&1\\end{{{env}}}"


RESTATEMENTS: dict[str, Template] = {
    "plain": lambda a, b, op: _expr(a, b, op),
    "gcd": lambda a, b, op: f"\\gcd({_expr(a, b, op)})",
    "gcd_twice": lambda a, b, op: f"\\gcd({_expr(a, b, op)}, {_expr(a, b, op)})",
    "lcm_with_one": lambda a, b, op: f"\\operatorname{{lcm}}({_expr(a, b, op)},1)",
    "operatorname_abs": lambda a, b, op: f"\\operatorname{{abs}}({_expr(a, b, op)})",
    "abs": lambda a, b, op: f"|{_expr(a, b, op)}|",
    "left_right_abs": lambda a, b, op: f"\\left|{_expr(a, b, op)}\\right|",
    "floor": lambda a, b, op: f"\\lfloor {_expr(a, b, op)}\\rfloor",
    "ceil": lambda a, b, op: f"\\lceil {_expr(a, b, op)}\\rceil",
    "max": lambda a, b, op: f"\\max({_expr(a, b, op)})",
    "max_with_zero": lambda a, b, op: f"\\max({_expr(a, b, op)}, 0)",
    "min_with_big": lambda a, b, op: f"\\min({_expr(a, b, op)}, 1000)",
    "det_pmatrix": lambda a, b, op: f"\\det{_det(a, b, op, 'pmatrix')}",
    "det_bmatrix": lambda a, b, op: f"\\det\\left({_det(a, b, op, 'bmatrix')}\\right)",
    "vmatrix": lambda a, b, op: _det(a, b, op, "vmatrix"),
    "mixed_number": lambda a, b, op: f"{a}\\frac{{{b if op == '+' else -b}}}{{1}}",
    "mixed_number_unreduced": lambda a, b, op: f"{a}\\frac{{{2 * b if op == '+' else -2 * b}}}{{2}}",
    "mixed_number_tfrac": lambda a, b, op: f"{a}\\tfrac{{{b if op == '+' else -b}}}{{1}}",
    "doubled_over_two": lambda a, b, op: f"\\frac{{2({_expr(a, b, op)})}}{{2}}",
    "over_one": lambda a, b, op: f"\\frac{{{_expr(a, b, op)}}}{{1}}",
    "to_the_first": lambda a, b, op: f"({_expr(a, b, op)})^1",
    "root_of_square": lambda a, b, op: f"\\sqrt{{({_expr(a, b, op)})^2}}",
    "first_root": lambda a, b, op: f"\\sqrt[1]{{{_expr(a, b, op)}}}",
    "plus_zero": lambda a, b, op: f"{_expr(a, b, op)}+0",
    "times_one": lambda a, b, op: f"({_expr(a, b, op)})\\cdot 1",
    "binom": lambda a, b, op: f"\\binom{{{_expr(a, b, op)}}}{{1}}",
    "dbinom": lambda a, b, op: f"\\dbinom{{{_expr(a, b, op)}}}{{1}}",
    "choose": lambda a, b, op: f"{{{_expr(a, b, op)} \\choose 1}}",
    "sum_operator": lambda a, b, op: f"\\sum_{{i=1}}^{{1}}({_expr(a, b, op)})",
    "product_operator": lambda a, b, op: f"\\prod_{{i=1}}^{{1}}({_expr(a, b, op)})",
    "integral": lambda a, b, op: f"\\int_0^1 ({_expr(a, b, op)})\\,dx",
    "limit": lambda a, b, op: f"\\lim_{{x\\to 0}}({_expr(a, b, op)})",
    "exp_log": lambda a, b, op: f"e^{{\\ln({_expr(a, b, op)})}}",
    "exp_of_log": lambda a, b, op: f"\\exp(\\ln({_expr(a, b, op)}))",
    "ten_to_log": lambda a, b, op: f"10^{{\\log_{{10}}({_expr(a, b, op)})}}",
    "operands_gcd": lambda a, b, op: f"\\gcd({a}){op}\\gcd({b})",
    "operands_abs": lambda a, b, op: f"|{a}|{op}|{b}|",
    "operands_max": lambda a, b, op: f"\\max({a}){op}{b}",
    "operands_braced": lambda a, b, op: f"{{{a}}}{op}{{{b}}}",
    "operands_binom": lambda a, b, op: f"\\binom{{{a}}}{{1}}{op}{b}",
    "set_of_it": lambda a, b, op: f"\\{{{_expr(a, b, op)}\\}}",
    "rhs_of_equation": lambda a, b, op: f"x = {_expr(a, b, op)}",
    "text_wrapped": lambda a, b, op: f"\\text{{{_expr(a, b, op)}}}",
    "value_gcd": lambda a, b, op: f"\\gcd({_value(a, b, op)})",
    "value_binom": lambda a, b, op: f"\\tbinom{{{_value(a, b, op)}}}{{1}}",
    "value_lcm": lambda a, b, op: f"\\operatorname{{lcm}}({_value(a, b, op)},1)",
    "value_exp_log": lambda a, b, op: f"e^{{\\ln {_value(a, b, op)}}}",
}
"""The problem's expression (or its value) restated through something the parser evaluates."""


def _scientific(v: int, bare_ten: bool) -> str | None:
    digits = str(v)
    if v <= 0 or (bare_ten and len(digits) != 2):
        return None
    mantissa = f"{digits[0]}.{digits[1:]}" if len(digits) > 1 else digits
    exponent = len(digits) - 1
    return f"{mantissa}\\times 10" if bare_ten else f"{mantissa}\\times10^{{{exponent}}}"


VALUE_FORMS: dict[str, Callable[[int], str | None]] = {
    "integer": lambda v: f"{v}",
    "decimal": lambda v: f"{v}.0",
    "trailing_point": lambda v: f"{v}.",
    "plus_sign": lambda v: f"+{v}",
    "double_negative": lambda v: f"--{v}",
    "unreduced_fraction": lambda v: f"\\frac{{{2 * v}}}{{2}}",
    "slash_fraction": lambda v: f"{3 * v}/3",
    "scientific": lambda v: _scientific(v, bare_ten=False),
    "scientific_bare_ten": lambda v: _scientific(v, bare_ten=True),
    "scientific_cdot": lambda v: s.replace("\\times", "\\cdot") if (s := _scientific(v, False)) else None,
    "percent": lambda v: f"{v}\\%",
    "grouped": lambda v: f"\\left({v}\\right)",
    "text": lambda v: f"\\text{{{v}}}",
    "assignment": lambda v: f"x = {v}",
    "with_unit": lambda v: f"{v} \\text{{ apples}}",
}
"""Written forms of the value the domain accepts (its module docstring and the answer table)."""


@pytest.fixture(scope="module")
def domain() -> Iterator[MathDomain]:
    d = MathDomain(MathReward(), cache_size=1)  # no cache: every example is checked
    yield d
    d.close()


def _problem(a: int, b: int, op: str) -> Problem:
    value = _value(a, b, op)
    return Problem(
        id=f"math-{a}{op}{b}", domain="math", prompt=f"What is {a}{op}{b}?", answer=f"\\boxed{{{value}}}"
    )


def _score(domain: MathDomain, problem: Problem, contents: list[str]) -> list[tuple[float, str, str]]:
    completions = [f"So the answer is $\\boxed{{{c}}}$." for c in contents]
    return [
        (v.reward, v.reason, v.detail) for v in domain.score_batch([problem] * len(completions), completions)
    ]


def _ordered(t: tuple[int, int, str]) -> tuple[int, int, str]:
    """As `draw_math_problem` orders a subtraction's operands: never below zero."""
    return (max(t[0], t[1]), min(t[0], t[1]), t[2]) if t[2] == "-" else t


operands = st.tuples(st.integers(1, 30), st.integers(1, 30), st.sampled_from(["+", "-"])).map(_ordered)
_SETTINGS = settings(
    derandomize=True,
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@_SETTINGS
@given(problem=operands, name=st.sampled_from(sorted(RESTATEMENTS)))
def test_restated_problem_earns_nothing(domain: MathDomain, problem: tuple[int, int, str], name: str) -> None:
    a, b, op = problem
    content = RESTATEMENTS[name](a, b, op)
    [(reward, reason, detail)] = _score(domain, _problem(a, b, op), [content])
    assert reward == 0.0 and reason != OK, f"{name}: {content!r} earned {reward} ({reason} {detail})"


@_SETTINGS
@given(problem=operands, name=st.sampled_from(sorted(VALUE_FORMS)))
def test_written_forms_of_the_value_earn_one(
    domain: MathDomain, problem: tuple[int, int, str], name: str
) -> None:
    a, b, op = problem
    content = VALUE_FORMS[name](_value(a, b, op))
    if content is None:
        return  # a form this value has none of (scientific notation of 0)
    [(reward, reason, detail)] = _score(domain, _problem(a, b, op), [content])
    assert (reward, reason) == (1.0, OK), f"{name}: {content!r} got {reason} ({detail})"


@pytest.mark.parametrize(("a", "b", "op"), [(47, 38, "+"), (30, 12, "-"), (9, 9, "-")])
def test_every_template_once(domain: MathDomain, a: int, b: int, op: str) -> None:
    """Each restatement and each value form at least once, whatever the examples drew."""
    problem = _problem(a, b, op)
    names = sorted(RESTATEMENTS)
    contents = [RESTATEMENTS[n](a, b, op) for n in names]
    verdicts = _score(domain, problem, contents)
    paid = [(n, c, v) for n, c, v in zip(names, contents, verdicts, strict=True) if v[0] != 0.0]
    assert not paid, paid
    forms = [(name, form) for name in sorted(VALUE_FORMS) if (form := VALUE_FORMS[name](_value(a, b, op)))]
    refused = [
        (name, form, verdict)
        for (name, form), verdict in zip(forms, _score(domain, problem, [f for _, f in forms]), strict=True)
        if verdict[:2] != (1.0, OK)
    ]
    assert not refused, refused

"""Is a parsed answer in closed form? The math verifier's guard against unevaluated answers.

math-verify compares values, so `47+38` equals a gold of 85: a policy that restates the
problem's arithmetic would be paid without doing it. The guard looks at the answer as parsed
(a sympy tree built with `evaluate=False`), never at its text, so grouping and spacing
(`\\left(47+38\\right)`, `[47+38]`, `47\\,+\\,38`, `\\lim_{x\\to0}(47+38)`) make no difference.

A final answer is in closed form unless its tree still holds an operation that evaluates away:

- a sum with two terms that sympy would combine: two numbers (`47+38`, `85+0`,
  `\\frac12+\\frac13`) or like terms (`\\sqrt2+\\sqrt2`, `x+x`), nested sums flattened and signs
  and numeric factors distributed first (`47-(\\sqrt2-38)+\\sqrt2` holds 47 and 38);
- a product with two numeric coefficients (`2\\cdot3`, `85\\cdot1`) or like factors
  (`\\sqrt2\\cdot\\sqrt2`); a sign (-1) is not a coefficient;
- an integer power of a number (`2^{10}`, `85^1`), except a power of ten (`10^6`, `8.5\\times10^1`,
  `1.5\\times10^{-3}`: scientific notation), and a root that is rational (`\\sqrt{4}`);
- a function of numbers whose value is rational (`|-85|`, `\\lfloor 85.5\\rfloor`, `\\sin 0`, `5!`);
- an unevaluated operator: a sum, product, limit, integral or derivative;
- against a gold without variables, any variable (`47+38\\cdot1^x`, `47+38(\\sin^2x+\\cos^2x)`,
  `\\frac{170x}{2x}`): if such an answer equals the gold, its variables cancel (relations and
  set conditions like `x \\ge 0` are exempt: their variable is their point).

Accepted as closed forms: number literals (`85`, `85.0`, `-85`), a fraction that is a number
(`\\frac{170}{2}`, `\\frac{4}{2}`: latex2sympy reads a fraction of integers as the rational it
is, and writing it needs the value), a numerator and a denominator around an irrational
(`\\frac{2\\sqrt3}{4}`), radicals and pi forms (`3\\sqrt2`, `\\sqrt{18}`, `\\frac{\\pi}{4}`), signs
(`--85` and `-(-85)` parse to 85: a sign restates nothing of the problem and needs the value),
percentages, and tuples, sets, intervals and equations of those.

The gold itself may be written in a form this rule calls unevaluated (an answer key with `2^{10}`):
an answer may leave unevaluated what the gold leaves unevaluated, node for node. When the answer
is an equation and the gold is not, only its last right-hand side is judged, as math-verify
compares only that (`47+38=85` commits to 85; `85=47+38` to the sum).

What it does not try to catch: a value disguised after it was computed (`\\binom{85}{1}` and
`e^{\\ln 85}`, which latex2sympy folds while parsing; `\\sqrt2(\\sqrt2+1)-\\sqrt2+83`). Those pay
only a policy that already knows the answer. The rule needs no problem text: it judges the
answer alone, so it holds for any prompt (an answer that echoes a problem's `\\frac{6}{4}` as
`\\frac{6}{4}` is read as the rational 3/2 and accepted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sympy
from sympy import Basic, MatrixBase

_OPERATORS = (sympy.Sum, sympy.Product, sympy.Limit, sympy.Integral, sympy.Derivative)
_RATIONAL_FUNCTIONS = (
    sympy.Abs,
    sympy.floor,
    sympy.ceiling,
    sympy.frac,
    sympy.sign,
    sympy.factorial,
    sympy.factorial2,
    sympy.binomial,
    sympy.Mod,
    sympy.Min,
    sympy.Max,
)
"""Functions whose value on rational arguments is rational: applied to numbers, they fold."""
_MAX_ROOT_DIGITS = 1000
"""Radicands longer than this are not tested for being perfect powers (judged irrational)."""


def _rational_valued(expr: Basic) -> bool:
    """Built from number literals by +, * and integer powers: a rational once evaluated."""
    if isinstance(expr, sympy.Number):
        return expr.is_finite is True
    if isinstance(expr, sympy.Pow):
        return isinstance(expr.exp, sympy.Integer) and _rational_valued(expr.base)
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return all(_rational_valued(arg) for arg in expr.args)
    return False


def _factors(expr: Basic) -> Iterator[Basic]:
    if isinstance(expr, sympy.Mul):
        for arg in expr.args:
            yield from _factors(arg)
    else:
        yield expr


_MAX_TERMS = 256
"""A sum is flattened into at most this many terms (more: judged as it is written)."""


def _terms(expr: Basic) -> list[Basic]:
    """The terms of a sum, nested sums flattened and numeric factors distributed over them:
    `47 - (\\sqrt2 - 38) - \\sqrt2` has the terms 47, -\\sqrt2, 38, -\\sqrt2 (a product of
    non-numbers is kept whole: `(x+1)(x-1)` is a form, not a sum to do)."""
    if isinstance(expr, sympy.Add):
        out = [t for arg in expr.args for t in _terms(arg)]
        return out if len(out) <= _MAX_TERMS else list(expr.args)
    if isinstance(expr, sympy.Mul):
        sums = [f for f in expr.args if isinstance(f, sympy.Add)]
        rest = [f for f in expr.args if not isinstance(f, sympy.Add)]
        if len(sums) == 1 and all(_rational_valued(f) or isinstance(f, sympy.UnevaluatedExpr) for f in rest):
            return [sympy.Mul(*rest, t, evaluate=False) for t in _terms(sums[0])]
    return [expr]


def _like_key(term: Basic) -> frozenset[tuple[Basic, int]]:
    """What a term is a multiple of: its factors that are not numbers (empty for a number)."""
    rest = Counter(f for f in _factors(term) if not _rational_valued(f))
    return frozenset(rest.items())


def _is_power_of_ten(expr: Basic) -> bool:
    return isinstance(expr, sympy.Pow) and expr.base == 10 and isinstance(expr.exp, sympy.Integer)


def _is_reciprocal(expr: Basic) -> bool:
    return isinstance(expr, sympy.Pow) and expr.exp == -1 and isinstance(expr.base, sympy.Number)


def _folding_product(expr: sympy.Mul) -> bool:
    coefficients = denominators = tens = 0
    bases: Counter[Basic] = Counter()
    for factor in _factors(expr):
        if factor == -1 or isinstance(factor, sympy.UnevaluatedExpr):  # a sign, a percent
            continue
        if _is_power_of_ten(factor):
            tens += 1
        elif _is_reciprocal(factor):
            denominators += 1
        elif _rational_valued(factor):
            coefficients += 1
        else:
            bases[factor.base if isinstance(factor, sympy.Pow) else factor] += 1
    return coefficients > 1 or denominators > 1 or tens > 1 or any(n > 1 for n in bases.values())


def _rational_root(expr: sympy.Pow) -> bool:
    """`\\sqrt{4}`, `8^{1/3}`: a root of a rational that is itself rational."""
    base, exp = expr.base, expr.exp
    if not (isinstance(exp, sympy.Rational) and isinstance(base, sympy.Rational) and base > 0):
        return False
    for part in (base.p, base.q):
        if len(str(part)) > _MAX_ROOT_DIGITS or not sympy.integer_nthroot(part, exp.q)[1]:
            return False
    return True


def _folds(node: Basic) -> str | None:
    """Why this node (not its children) is an operation still to be evaluated, or None."""
    if isinstance(node, _OPERATORS):
        return f"unevaluated {type(node).__name__.lower()}"
    if isinstance(node, sympy.Add):
        keys = Counter(_like_key(term) for term in _terms(node))
        if any(n > 1 for n in keys.values()):
            return "a sum still to be done"
    elif isinstance(node, sympy.Mul):
        if _folding_product(node):
            return "a product still to be done"
    elif isinstance(node, sympy.Pow):
        if _is_power_of_ten(node) or _is_reciprocal(node):
            return None
        if isinstance(node.exp, sympy.Integer) and _rational_valued(node.base):
            return "a power still to be done"
        if _rational_root(node):
            return "a root that is rational"
    elif isinstance(node, sympy.Function) or isinstance(node, _RATIONAL_FUNCTIONS):
        if node.args and all(_rational_valued(arg) for arg in node.args):
            if isinstance(node, _RATIONAL_FUNCTIONS):
                return f"{type(node).__name__} of numbers"
            value = node.func(*node.args)  # sin(0), log(100, 10): sympy folds the exact cases
            if isinstance(value, sympy.Rational):
                return f"{type(node).__name__} of numbers"
    return None


def _nodes(expr: Basic | MatrixBase) -> Iterator[Basic]:
    if isinstance(expr, MatrixBase):
        for element in expr:
            yield from _nodes(element)
        return
    yield from sympy.preorder_traversal(expr)


def unevaluated_parts(expr: Basic | MatrixBase) -> dict[Basic, str]:
    """Every node of `expr` that is an operation still to be evaluated, with why."""
    out: dict[Basic, str] = {}
    for node in _nodes(expr):
        if isinstance(node, Basic) and (why := _folds(node)):
            out.setdefault(node, why)
    return out


def _judged_part(expr: Any, gold: Sequence[Any]) -> Any:
    """What math-verify compares of an answer: the last right-hand side of an equation when
    the gold is not one, else the whole answer."""
    from math_verify.grader import is_equation, take_last_relation

    if is_equation(expr) and not any(is_equation(g) for g in gold if isinstance(g, (Basic, MatrixBase))):
        return take_last_relation(expr).rhs
    return expr


def _trees(parsed: Iterable[Any]) -> list[Basic | MatrixBase]:
    return [p for p in parsed if isinstance(p, (Basic, MatrixBase))]


def _variables(expr: Basic | MatrixBase) -> set[str]:
    return {str(s) for s in expr.free_symbols}


_CONDITIONS = (sympy.logic.boolalg.Boolean, sympy.ConditionSet, sympy.ImageSet)
"""Answers whose variables are their point (`x \\ge 0`, `x \\in \\{1,2\\}`): the variable rule skips them."""


def not_closed_form(gold: Sequence[Any], pred: Sequence[Any]) -> str | None:
    """Why the parsed answer `pred` is not a closed form (see the module docstring), or None.

    `gold` and `pred` are math-verify `parse` results (sympy trees and strings)."""
    allowed: set[Basic] = set()
    gold_variables: set[str] = set()
    for tree in _trees(gold):
        allowed |= set(unevaluated_parts(tree))
        gold_variables |= _variables(tree)
    for tree in _trees(pred):
        judged = _judged_part(tree, gold)
        for node, why in unevaluated_parts(judged).items():
            if node not in allowed:
                return f"{why}: {sympy.sstr(node)[:60]}"
        if gold_variables or isinstance(judged, _CONDITIONS):
            continue  # a symbolic or text gold: math-verify matches variables itself
        if variables := _variables(judged):
            return f"a variable in an answer that has none: {', '.join(sorted(variables))[:60]}"
    return None

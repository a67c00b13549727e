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
- any constant part whose value is a rational number but is not written as one (the catch-all:
  `(\\sqrt2)^2`, `\\cos(2\\pi)`, `38(1+\\sqrt2)(\\sqrt2-1)`): evaluated bottom-up within small
  bounds (no power tower is computed), small products of sums multiplied out. A rational value
  is written as a number: an integer, a decimal, a fraction, scientific notation, a percentage;
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


_MAX_EVALUATED_DIGITS = 30
"""A function of numbers is evaluated (to see whether it folds) only on numbers this short."""
_MAX_VALUE_DIGITS = 1000
_MAX_EXPONENT = 1000
_MAX_EVALUATED_NODES = 500
"""Bounds on evaluating constant subexpressions: no power tower or huge product is computed."""


class _Values:
    """Values of an answer's constant subexpressions, computed bottom-up within small bounds
    (None: has a variable, or too big to compute, or not a number)."""

    def __init__(self) -> None:
        self._memo: dict[Basic, Basic | None] = {}

    def of(self, expr: Basic) -> Basic | None:
        if expr in self._memo:
            return self._memo[expr]
        value = self._compute(expr) if len(self._memo) < _MAX_EVALUATED_NODES else None
        self._memo[expr] = value
        return value

    def _compute(self, expr: Basic) -> Basic | None:
        if isinstance(expr, sympy.Number):
            return expr if expr.is_finite and _digits(expr) <= _MAX_VALUE_DIGITS else None
        if isinstance(expr, (sympy.NumberSymbol, sympy.core.numbers.ImaginaryUnit)):
            return expr
        if isinstance(expr, sympy.UnevaluatedExpr):
            return self.of(expr.args[0])
        if not isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow, sympy.Function)) or not expr.args:
            return None
        args = [self.of(arg) for arg in expr.args]
        if any(arg is None for arg in args):
            return None
        if isinstance(expr, sympy.Pow) and not _small_power(args[0], args[1]):
            return None
        try:
            value = expr.func(*args)
        except Exception:  # a domain error, a division by zero: no value
            return None
        if isinstance(value, sympy.Number) and not (value.is_finite and _digits(value) <= _MAX_VALUE_DIGITS):
            return None
        return value


def _digits(number: Basic) -> int:
    if isinstance(number, sympy.Rational):
        return len(str(abs(number.p))) + len(str(number.q))
    return 0


def _small_power(base: Basic, exp: Basic) -> bool:
    if isinstance(exp, sympy.Integer):
        return abs(int(exp)) <= _MAX_EXPONENT and (_digits(base) * abs(int(exp)) <= _MAX_VALUE_DIGITS)
    return not isinstance(exp, sympy.Number) or isinstance(exp, sympy.Rational) and exp.q <= _MAX_EXPONENT


def _is_notation(node: Basic) -> bool:
    """How numbers are written rather than computed: a sign, a fraction, a power of ten,
    scientific notation, a percentage (`-\\frac{3}{2}`, `3/2`, `10^6`, `8.5\\times10^1`, `85\\%`)."""
    if (
        isinstance(node, (sympy.Number, sympy.UnevaluatedExpr))
        or _is_power_of_ten(node)
        or _is_reciprocal(node)
    ):
        return True
    if not isinstance(node, sympy.Mul):
        return False
    kinds: Counter[str] = Counter()
    for factor in _factors(node):
        if factor == -1:
            continue
        if isinstance(factor, sympy.Number):
            kinds["number"] += 1
        elif _is_power_of_ten(factor):
            kinds["ten"] += 1
        elif _is_reciprocal(factor):
            kinds["denominator"] += 1
        elif isinstance(factor, sympy.UnevaluatedExpr) and factor.args[0] == sympy.Rational(1, 100):
            kinds["percent"] += 1
        else:
            return False
    return all(n <= 1 for n in kinds.values())


def _small_number(expr: Basic) -> bool:
    if isinstance(expr, sympy.Rational):
        return max(len(str(abs(expr.p))), len(str(expr.q))) <= _MAX_EVALUATED_DIGITS
    return isinstance(expr, sympy.Float) or (
        _is_power_of_ten(expr) and abs(expr.exp) <= _MAX_EVALUATED_DIGITS
    )


def _folds(node: Basic, values: _Values) -> str | None:
    """Why this node (not its children) is an operation still to be evaluated, or None."""
    why = _folds_structurally(node)
    if why is None and not _is_notation(node) and _rational(values.of(node)):
        why = "a computation whose value is a number"
    return why


_MAX_EXPANDED_OPS = 30
_MAX_EXPANDED_EXPONENT = 4


def _rational(value: Basic | None) -> bool:
    """Whether a constant's value is a rational number, products of sums multiplied out
    (`(1+\\sqrt2)(\\sqrt2-1)` is 1) when they are small enough to expand cheaply."""
    if value is None or isinstance(value, sympy.Rational):
        return value is not None
    if not value.has(sympy.Add) or sympy.count_ops(value) > _MAX_EXPANDED_OPS:
        return False
    if any(abs(p.exp) > _MAX_EXPANDED_EXPONENT for p in value.atoms(sympy.Pow) if p.exp.is_Integer):
        return False
    return isinstance(sympy.expand(value), sympy.Rational)


def _folds_structurally(node: Basic) -> str | None:
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
            if all(_small_number(arg) for arg in node.args):  # sin(0), log(100, 10): sympy folds
                if isinstance(node.func(*node.args), sympy.Rational):
                    return f"{type(node).__name__} of numbers"
    return None


def _nodes(expr: Basic | MatrixBase) -> Iterator[Basic]:
    if isinstance(expr, MatrixBase):
        for element in expr:
            yield from _nodes(element)
        return
    yield from sympy.preorder_traversal(expr)


def unevaluated_parts(expr: Basic | MatrixBase) -> Iterator[tuple[Basic, str]]:
    """Every node of `expr` that is an operation still to be evaluated, with why (outermost first)."""
    values = _Values()
    for node in _nodes(expr):
        if isinstance(node, Basic) and (why := _folds(node, values)):
            yield node, why


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
        allowed |= {node for node, _ in unevaluated_parts(tree)}
        gold_variables |= _variables(tree)
    for tree in _trees(pred):
        judged = _judged_part(tree, gold)
        for node, why in unevaluated_parts(judged):
            if node not in allowed:
                return f"{why}: {sympy.sstr(node)[:60]}"
        if gold_variables or isinstance(judged, _CONDITIONS):
            continue  # a symbolic or text gold: math-verify matches variables itself
        if variables := _variables(judged):
            return f"a variable in an answer that has none: {', '.join(sorted(variables))[:60]}"
    return None

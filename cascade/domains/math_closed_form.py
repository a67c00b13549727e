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

The written form comes first (`written_form_breach`): latex2sympy folds some constructs while it
reads them (`\\gcd(47+38)`, `\\operatorname{lcm}(47+38,1)`, a `\\det` or `vmatrix`, the mixed number
`47\\frac{38}{1}`, `\\binom{85}{1}`, `e^{\\ln 85}` all parse to the bare 85), so the text math-verify
extracted is read first against an allow-list grammar (`_WrittenForm`): numbers, fractions of
integers, radicals, pi and e, letters, text, scientific notation, percentages, proper mixed
numbers, intervals, sets, tuples and relations of those; at most one number among the terms of a
sum or the factors of a product; no integer power of a number but ten; no command, environment or
symbol outside the allow list. What the gold is itself written with is allowed (the same part, or
the same command). A gold the grammar cannot read leaves the answer to the tree rule alone.

What it does not try to catch: a value disguised after it was computed in allowed notation
(`\\sqrt2(\\sqrt2+1)-\\sqrt2+83`). That pays only a policy that already knows the answer. The rule
needs no problem text: it judges the answer alone, so it holds for any prompt (an answer that
echoes a problem's `\\frac{6}{4}` as `\\frac{6}{4}` is a fraction of integers and accepted).
"""

from __future__ import annotations

import re
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


def _texts(parsed: Iterable[Any]) -> list[str]:
    return [p for p in parsed if isinstance(p, str)]


def _variables(expr: Basic | MatrixBase) -> set[str]:
    return {str(s) for s in expr.free_symbols}


_CONDITIONS = (sympy.logic.boolalg.Boolean, sympy.ConditionSet, sympy.ImageSet)
"""Answers whose variables are their point (`x \\ge 0`, `x \\in \\{1,2\\}`): the variable rule skips them."""


def not_closed_form(gold: Sequence[Any], pred: Sequence[Any]) -> str | None:
    """Why the parsed answer `pred` is not a closed form (see the module docstring), or None.

    `gold` and `pred` are math-verify `parse` results (sympy trees and strings)."""
    allowed: set[Basic] = set()
    if why := written_form_breach(_texts(gold), _texts(pred)):
        return why
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


# --------------------------------------------------------------------------- the written form


class _Unreadable(Exception):
    """The written answer is not in the grammar at all (unbalanced, truncated, too deep)."""


_WRITTEN_TOKEN = re.compile(
    r"(?P<skip>\s+|\\[,;:!> ]|~|\\q?quad(?![A-Za-z])|\\(?:left|right)\s*\.|\\\$|\\(?:left|right|[bB]igg?[lr]?"
    r"|displaystyle|textstyle|limits|nolimits)(?![A-Za-z]))"
    r"|(?P<env>\\(?:begin|end)\s*\{[A-Za-z*]+\})"
    r"|(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"|(?P<cmd>\\[A-Za-z]+|\\.)"
    r"|(?P<char>.)",
    re.S,
)
_FRACTIONS = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"})
_TEXT = frozenset(
    {
        "\\text",
        "\\textbf",
        "\\textrm",
        "\\textit",
        "\\textnormal",
        "\\mathrm",
        "\\mathbf",
        "\\mathit",
        "\\mbox",
        "\\mathbb",
        "\\mathcal",
        "\\mathsf",
        "\\mathtt",
        "\\boldsymbol",
    }
)
"""Commands whose argument is read as a word (a unit, a name, a choice, a set like `\\mathbb{R}`)."""
_CONSTANTS = frozenset(
    {"\\pi", "\\infty", "\\circ", "\\degree", "\\emptyset", "\\varnothing", "\\%"}
    | {
        f"\\{g}"
        for g in (
            "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
            "rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega"
        ).split()
    }
)
_SIGNS = frozenset({"+", "-", "\\pm", "\\mp"})
_SET_OPERATORS = frozenset({"\\cup", "\\cap", "\\setminus"})
_PRODUCT_OPERATORS = frozenset({"\\cdot", "\\times", "*", "/", "\\div"})
_RELATIONS = frozenset(
    {
        "=",
        "<",
        ">",
        "\\le",
        "\\leq",
        "\\ge",
        "\\geq",
        "\\lt",
        "\\gt",
        "\\ne",
        "\\neq",
        "\\leqslant",
        "\\geqslant",
        "\\in",
        "\\notin",
        "\\subset",
        "\\subseteq",
    }
)
_SEPARATORS = frozenset({",", ";"})
_MATRICES = frozenset({"pmatrix", "bmatrix", "Bmatrix", "matrix", "smallmatrix", "array"})
_CLOSERS = frozenset({")", "]", "}", "\\}", "&", "\\\\", "|"})
_MAX_DEPTH = 60
"""Groups nested deeper than this are not read (the answer is refused, never recursed into)."""
_MAX_TOKENS = 4000


class _Form:
    """What a piece of a written answer is: `kind` is `int`, `decimal`, `fraction` (of integers),
    `ten` (a power of ten), `notation` (scientific, a percentage): number literals; `numbers`: an
    operation on numbers (already recorded as not a closed form); `other`: anything else."""

    __slots__ = ("kind", "start", "end")

    def __init__(self, kind: str, start: int, end: int) -> None:
        self.kind, self.start, self.end = kind, start, end

    @property
    def numeric(self) -> bool:
        """Built from number literals only: a rational number once evaluated."""
        return self.kind != "other"


class _WrittenForm:
    """A recursive-descent reader of a written answer against the closed-form grammar:

        list     := relation ((',' | ';') relation)*
        relation := sum (RELATION sum)*
        sum      := SIGN* product ((SIGN | \\cup | \\cap | \\setminus) SIGN* product)*
        product  := power ((\\cdot | \\times | * | / | \\div)? power)*
        power    := atom ('^' arg | '_' arg | '!' | "'" | '\\%')*
        atom     := NUMBER | LETTER | CONSTANT | '{' list '}' | ('(' | '[') list (')' | ']')
                  | '\\{' list '\\}' | \\frac arg arg | \\sqrt ['[' list ']'] arg | TEXT '{' word '}'
                  | \\begin{matrix} list (('&' | '\\\\') list)* \\end{matrix}

    with the rules that make it a closed form: at most one number among the terms of a sum and
    among the factors of a product (scientific notation excepted: `8.5\\times10^{1}`), a fraction
    of integers only, no integer power of a number but ten, no command, environment or symbol
    outside the allow list. `violations` holds each breach: (why, the written part, its key)."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        for match in _WRITTEN_TOKEN.finditer(text):
            if match.lastgroup != "skip":
                self.tokens.append(re.sub(r"\s+", "", match.group()))
            if len(self.tokens) > _MAX_TOKENS:
                raise _Unreadable("too long")
        self.pos = 0
        self.depth = 0
        self.violations: list[tuple[str, str]] = []
        self.unlisted: list[str] = []

    # ------------------------------------------------------------- helpers

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        if self.pos >= len(self.tokens):
            raise _Unreadable("ends early")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def expect(self, *tokens: str) -> str:
        token = self.take()
        if token not in tokens:
            raise _Unreadable(f"{token!r} where {' or '.join(tokens)} was expected")
        return token

    def written(self, start: int, end: int) -> str:
        return " ".join(t for t in self.tokens[start:end] if t not in ("{", "}"))

    def breach(self, why: str, start: int, end: int) -> None:
        self.violations.append((why, self.written(start, end)))

    def unlisted_token(self, token: str) -> None:
        self.unlisted.append(token)

    # ------------------------------------------------------------- grammar

    def read(self) -> _Form:
        form = self.elements({None})
        if self.pos != len(self.tokens):
            raise _Unreadable(f"unexpected {self.tokens[self.pos]!r}")
        return form

    def elements(self, stops: set[str | None]) -> _Form:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Unreadable("nested too deep")
        start = self.pos
        items = [self.relation(stops)]
        while self.peek() in _SEPARATORS:
            self.take()
            items.append(self.relation(stops))
        self.depth -= 1
        return items[0] if len(items) == 1 else _Form("other", start, self.pos)

    def relation(self, stops: set[str | None]) -> _Form:
        start = self.pos
        form = self.sum(stops)
        related = False
        while self.peek() in _RELATIONS:
            self.take()
            self.sum(stops)
            related = True
        return _Form("other", start, self.pos) if related else form

    def sum(self, stops: set[str | None]) -> _Form:
        start = self.pos
        while self.peek() in _SIGNS:
            self.take()
        terms = [self.product(stops)]
        sets = False
        while (token := self.peek()) in _SIGNS or token in _SET_OPERATORS:
            sets |= token in _SET_OPERATORS
            self.take()
            while self.peek() in _SIGNS:
                self.take()
            terms.append(self.product(stops))
        if len(terms) == 1:
            return terms[0]
        if sum(term.numeric for term in terms) > 1 and not sets:
            self.breach("a sum of numbers", start, self.pos)
        return _Form("numbers" if all(t.numeric for t in terms) else "other", start, self.pos)

    def _starts_atom(self, token: str | None, stops: set[str | None]) -> bool:
        return not (
            token is None
            or token in stops
            or token in _CLOSERS
            or token in _SEPARATORS
            or token in _RELATIONS
            or token in _SIGNS
            or token in _SET_OPERATORS
            or token.startswith("\\end")
        )

    def product(self, stops: set[str | None]) -> _Form:
        start = self.pos
        factors = [self.power(stops)]
        operators: list[str] = []
        while True:
            token = self.peek()
            if token in _PRODUCT_OPERATORS:
                operators.append(self.take())
            elif self._starts_atom(token, stops):
                operators.append("")
            else:
                break
            factors.append(self.power(stops))
        if len(factors) == 1:
            return factors[0]
        # Segments multiplied together, each divided by the next (`3\\sqrt{2}/2`, `170/2`).
        segments: list[list[_Form]] = [[factors[0]]]
        divisions: list[str] = []
        for operator, factor in zip(operators, factors[1:], strict=True):
            if operator in ("/", "\\div"):
                divisions.append(operator)
                segments.append([factor])
            else:
                segments[-1].append(factor)
        numeric = []
        for i, segment in enumerate(segments):
            numbers = [f for f in segment if f.numeric]
            scientific = len(segment) == 2 and self._scientific(segment, operators, factors)
            if len(numbers) > 1 and not scientific and not self._proper_mixed(segment, operators, factors):
                mixed = any(
                    a.kind == "int" and b.kind == "fraction"
                    for a, b in zip(segment, segment[1:], strict=False)
                )
                self.breach(
                    "a mixed number" if mixed else "a product of numbers", segment[0].start, segment[-1].end
                )
            numeric.append(len(numbers) == len(segment))
            if i and numeric[-1] and numeric[-2]:
                if divisions == ["/"] and [f.kind for f in factors] == ["int", "int"]:
                    return _Form("fraction", start, self.pos)  # 170/2
                self.breach("a quotient of numbers", segments[i - 1][0].start, segment[-1].end)
        if (
            len(segments) == 1
            and len(factors) == 2
            and numeric[0]
            and self._scientific(factors, operators, factors)
        ):
            return _Form("notation", start, self.pos)
        return _Form("numbers" if all(numeric) else "other", start, self.pos)

    def _proper_mixed(self, pair: list[_Form], operators: list[str], factors: list[_Form]) -> bool:
        """`3\\frac{1}{2}`: a whole number and a proper fraction, juxtaposed (`47\\frac{38}{1}` is not:
        its fraction is not proper, so it adds two numbers rather than writing one)."""
        if (
            len(pair) != 2
            or [f.kind for f in pair] != ["int", "fraction"]
            or operators[factors.index(pair[1]) - 1]
        ):
            return False
        fraction = self.tokens[pair[1].start : pair[1].end]
        if fraction[0] not in _FRACTIONS:
            return False
        numbers = [int(t) for t in fraction if t.isdigit()]
        return len(numbers) == 2 and 0 < numbers[0] < numbers[1]

    def _scientific(self, pair: list[_Form], operators: list[str], factors: list[_Form]) -> bool:
        """`8.5\\times10^{1}`, `1.2\\cdot10^3`, `8.5\\times 10`: a number times a power of ten."""
        mantissa, ten = pair
        if operators[factors.index(ten) - 1] not in ("\\times", "\\cdot"):
            return False
        if mantissa.kind not in ("int", "decimal"):
            return False
        if ten.kind == "ten":
            return True
        digits = self.tokens[mantissa.start : mantissa.end]
        written = digits[-1] if digits else ""
        return (
            ten.kind == "int"
            and self.tokens[ten.start : ten.end] == ["10"]
            and re.fullmatch(r"[1-9]\.\d+", written) is not None
        )

    def power(self, stops: set[str | None]) -> _Form:
        start = self.pos
        form = self.atom(stops)
        while (token := self.peek()) in ("^", "_", "!", "'", "\\%"):
            self.take()
            if token == "^":
                if self.peek() in ("\\circ", "\\degree") or self.tokens[self.pos : self.pos + 3] == [
                    "{",
                    "\\circ",
                    "}",
                ]:
                    self.arg()  # a degree sign: a unit
                    continue
                exponent = self.arg()
                base_written = self.tokens[form.start : form.end]
                if form.kind == "int" and base_written == ["10"] and exponent.kind == "int":
                    form = _Form("ten", start, self.pos)
                elif form.numeric and exponent.kind == "int":
                    self.breach("a power of a number", start, self.pos)
                    form = _Form("numbers", start, self.pos)
                else:
                    form = _Form("other", start, self.pos)  # a root (2^{1/3}), a variable's power
            elif token == "_":
                self.arg()
                if form.numeric:
                    self.breach("a subscript on a number", start, self.pos)
                form = _Form("other" if not form.numeric else "numbers", start, self.pos)
            elif token == "\\%":
                form = _Form(
                    "notation" if form.kind in ("int", "decimal", "fraction") else form.kind, start, self.pos
                )
            elif token == "!":
                self.unlisted_token("!")
                form = _Form("numbers" if form.numeric else "other", start, self.pos)
            else:  # a prime: f'(x)
                form = _Form("other", start, self.pos)
        return form

    def arg(self) -> _Form:
        """A command's argument: a braced group, or one token (`\\frac12`, `10^3`)."""
        token = self.peek()
        if token == "{":
            return self.atom(set())
        if token is not None and token[0].isdigit() and len(token) > 1 and "." not in token:
            self.tokens[self.pos : self.pos + 1] = [token[0], token[1:]]
        return self.atom(set())

    def raw_group(self) -> None:
        """A braced argument read as text (`\\text{ apples}`, `\\mathbb{R}`)."""
        if self.peek() != "{":
            self.take()
            return
        depth = 0
        while True:
            token = self.take()
            depth += {"{": 1, "}": -1}.get(token, 0)
            if depth == 0:
                return

    def group(self, close: set[str]) -> _Form:
        start = self.pos
        self.take()
        inner = self.elements(set(close))
        self.expect(*close)
        return _Form(inner.kind, start, self.pos)

    def atom(self, stops: set[str | None]) -> _Form:
        start = self.pos
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return _Form("decimal" if "." in token else "int", start, self.pos)
        if len(token) == 1 and token.isalpha():
            return _Form("other", start, self.pos)
        if token == "{":
            self.pos = start
            return self.group({"}"})
        if token in ("(", "["):
            self.pos = start
            inner = self.group({")", "]"})
            single = self.tokens[self.pos - 1] == {"(": ")", "[": "]"}[token]
            return inner if single else _Form("other", start, self.pos)  # an interval
        if token == "\\{":
            self.pos = start
            self.group({"\\}"})
            return _Form("other", start, self.pos)
        if token == "|":
            self.unlisted_token("|")
            self.pos = start
            inner = self.group({"|"})
            return _Form("numbers" if inner.numeric else "other", start, self.pos)
        if token in _FRACTIONS:
            numerator, denominator = self.arg(), self.arg()
            if numerator.kind == "int" and denominator.kind == "int":
                return _Form("fraction", start, self.pos)
            if numerator.numeric and denominator.numeric:
                self.breach("a fraction of numbers that are not integers", start, self.pos)
                return _Form("numbers", start, self.pos)
            return _Form("other", start, self.pos)
        if token == "\\sqrt":
            if self.peek() == "[":
                self.group({"]"})
            self.arg()
            return _Form("other", start, self.pos)  # a rational root is the parsed tree's to see
        if token in _TEXT:
            self.raw_group()
            return _Form("other", start, self.pos)
        if token in _CONSTANTS:
            return _Form("other", start, self.pos)
        if token == "\\boxed":
            return _Form(self.arg().kind, start, self.pos)
        if token.startswith("\\begin"):
            return self.environment(token, start)
        if token == "\\operatorname":
            name = self.pos
            self.raw_group()
            self.unlisted_token("\\operatorname{" + "".join(self.tokens[name : self.pos]).strip("{}") + "}")
            return _Form("other", start, self.pos)
        if token not in ("\\rfloor", "\\rceil"):  # the \\lfloor, \\lceil they close is reported
            self.unlisted_token(token)  # \\gcd, \\det, \\binom, \\sin, \\lim, \\int, ... and stray symbols
        return _Form("other", start, self.pos)

    def environment(self, begin: str, start: int) -> _Form:
        name = begin[begin.index("{") + 1 : -1]
        self.unlisted_token("\\begin{matrix}" if name in _MATRICES else begin)
        if name == "array" and self.peek() == "{":
            self.raw_group()
        end = f"\\end{{{name}}}"
        while self.peek() != end:
            if self.peek() is None:
                raise _Unreadable(f"{begin} never ends")
            self.elements({"&", "\\\\", end})
            if self.peek() in ("&", "\\\\"):
                self.take()
            elif self.peek() != end:
                raise _Unreadable(f"unexpected {self.peek()!r} in {begin}")
        self.take()
        return _Form("other", start, self.pos)

    def judged_tokens(self) -> None:
        """Keep only what follows an equation's last top-level `=` (`47+38=85` commits to 85, as
        math-verify compares only that), unless the answer is a list."""
        depth, last = 0, -1
        for i, token in enumerate(self.tokens):
            if token in ("{", "(", "[", "\\{") or token.startswith("\\begin"):
                depth += 1
            elif token in ("}", ")", "]", "\\}") or token.startswith("\\end"):
                depth -= 1
            elif depth == 0 and token in _SEPARATORS:
                return
            elif depth == 0 and token == "=":
                last = i
        if last >= 0:
            self.tokens = self.tokens[last + 1 :]


_WHAT = {
    "\\lim": " (a limit)",
    "\\int": " (an integral)",
    "\\sum": " (an unevaluated sum)",
    "\\prod": " (an unevaluated product)",
    "|": " (Abs)",
    "\\lfloor": " (floor)",
    "\\lceil": " (ceiling)",
    "!": " (factorial)",
    "\\det": " (a determinant)",
    "\\begin{vmatrix}": " (a determinant)",
}
"""What a command outside the grammar computes, where its name does not say."""


def _read_written(text: str, *, rhs_only: bool = False) -> _WrittenForm:
    reader = _WrittenForm(text)
    if rhs_only:
        reader.judged_tokens()
    try:
        reader.read()
    except RecursionError as err:
        raise _Unreadable("nested too deep") from err
    return reader


def written_form_breach(gold: Sequence[str], answer: Sequence[str]) -> str | None:
    """Why the written answer (math-verify's extracted text, before anything evaluates it) is
    not a closed form, or None. A breach the gold itself is written with is allowed (the same
    written part; or the same command: a gold with `\\log` allows `\\log`); a gold outside the
    grammar leaves the answer to the parsed-tree rule alone."""
    allowed_parts: set[str] = set()
    allowed_tokens: set[str] = set()
    equation = False
    for text in gold:
        try:
            reader = _read_written(text)
        except _Unreadable:
            return None
        allowed_parts |= {part for _, part in reader.violations}
        allowed_tokens |= set(reader.unlisted)
        equation |= "=" in reader.tokens
    for text in answer:
        try:
            reader = _read_written(text, rhs_only=not equation)
        except _Unreadable as err:
            return f"not written in the closed-form grammar ({err})"
        whys = [
            f"{token}{_WHAT.get(token, '')} is outside the closed-form grammar"
            for token in reader.unlisted
            if token not in allowed_tokens
        ]
        whys += [f"written as {why}: {part}" for why, part in reader.violations if part not in allowed_parts]
        if whys:
            return "; ".join(dict.fromkeys(whys))[:200]
    return None

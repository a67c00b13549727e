"""Exact arithmetic for the `calc` tool: a small recursive-descent parser over fractions.

Nothing is evaluated as Python. Grammar: `+ - * / // %`, `^` or `**` (integer exponents),
unary signs, parentheses, integers and decimals. Every bound is checked as it is reached, so
an expression's cost is bounded by its length: at most `MAX_CHARS` characters, nesting
`MAX_DEPTH`, exponents up to `MAX_EXPONENT` in size and values of at most `MAX_BITS` bits
(numerator and denominator). The result is an integer (`"12"`) or a reduced fraction (`"7/2"`).
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_EXPONENT = 64
MAX_BITS = 256

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(\*\*|//|[-+*/%^()]))")


class CalcError(ValueError):
    """The expression is not one the calculator accepts (the message says why)."""


def calculate(expression: str) -> str:
    if len(expression) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    tokens = _tokens(expression)
    if not tokens:
        raise CalcError("empty expression")
    parser = _Parser(tokens)
    value = parser.expression(0)
    if parser.at < len(tokens):
        raise CalcError(f"unexpected {tokens[parser.at]!r}")
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None:
            raise CalcError(f"unexpected character {text[at:].lstrip()[:1]!r}")
        out.append(match.group(1) or match.group(2))
        at = match.end()
    return out


def _checked(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise CalcError(f"value too large (over {MAX_BITS} bits)")
    return value


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.at = 0

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise CalcError("expression ends too early")
        self.at += 1
        return token

    def expression(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise CalcError(f"nested deeper than {MAX_DEPTH}")
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op, right = self._take(), self._term(depth)
            value = _checked(value + right if op == "+" else value - right)
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._unary(depth)
        while self._peek() in ("*", "/", "//", "%"):
            op, right = self._take(), self._unary(depth)
            if op == "*":
                value = _checked(value * right)
                continue
            if right == 0:
                raise CalcError("division by zero")
            if op == "/":
                value = _checked(value / right)
            elif op == "//":
                value = Fraction(value // right)
            else:
                value = _checked(value % right)
        return value

    def _unary(self, depth: int) -> Fraction:
        if self._peek() in ("-", "+"):
            sign = self._take()
            if depth + 1 > MAX_DEPTH:
                raise CalcError(f"nested deeper than {MAX_DEPTH}")
            value = self._unary(depth + 1)
            return -value if sign == "-" else value
        return self._power(depth)

    def _power(self, depth: int) -> Fraction:
        base = self._atom(depth)
        if self._peek() not in ("^", "**"):
            return base
        self._take()
        exponent = self._unary(depth + 1)
        if exponent.denominator != 1:
            raise CalcError("exponent must be an integer")
        if abs(exponent) > MAX_EXPONENT:
            raise CalcError(f"exponent larger than {MAX_EXPONENT}")
        if base == 0 and exponent < 0:
            raise CalcError("division by zero")
        if abs(base.numerator).bit_length() * abs(int(exponent)) > MAX_BITS or (
            base.denominator.bit_length() * abs(int(exponent)) > MAX_BITS
        ):
            raise CalcError(f"value too large (over {MAX_BITS} bits)")
        return _checked(base ** int(exponent))

    def _atom(self, depth: int) -> Fraction:
        token = self._take()
        if token == "(":
            value = self.expression(depth + 1)
            if self._take() != ")":
                raise CalcError("expected ')'")
            return value
        if token[0].isdigit():
            if len(token) > 40:
                raise CalcError("number longer than 40 digits")
            return Fraction(token)
        raise CalcError(f"unexpected {token!r}")

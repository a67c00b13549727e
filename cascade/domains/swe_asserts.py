"""A test function's literal expectations taken out of the process that runs it.

A test id runs in the sandbox's program process, beside the patched code: whatever that process
answers ("the test passed") the patch can forge, by rewriting the driver, writing on the judge's
pipe or returning an object whose `__eq__` always holds. What the patch cannot forge is a value
it does not know. So before the job is built, on the host, each assertion at the top level of a
named test's body that compares a computed value with a literal

    assert total([1, 2, 3]) == 6            self.assertEqual(total([]), 0)
    assert parse("x") is None              self.assertIsNone(parse(""))

is rewritten to hand the computed value to the driver (`__cascade_expect__(value)`), and the
literal leaves the source: the test file the sandbox receives no longer holds it. The driver
answers the values in the order the test reached them, as plain JSON data (an object that is not
JSON data fails the test where it is handed over); the sandbox's judge, which alone holds the
literals, compares them by its value rules. A forged "passed" must now carry values only the
right code computes.

Only the top level of the test's own body is lifted (those assertions run exactly once, in
order, when the test passes); assertions inside loops, branches, `with` blocks or helpers, and
comparisons whose expected side is not a literal, still run in the shared process and guard
only as far as that process can be trusted (docs/verifiers.md).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

RECORDER = "__cascade_expect__"
"""The builtin the driver provides: takes the computed value, returns nothing."""

_ASSERT_EQUAL = frozenset({"assertEqual", "assertEquals"})


@dataclass
class Lifted:
    """A test file with the literals of the named tests' top-level assertions taken out."""

    source: str
    expected: dict[str, list[Any]] = field(default_factory=dict)
    """Per test name (`function` or `Class::method`), the literals in the order they are checked."""


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """(True, value) when `node` is a literal that is plain JSON data with one JSON spelling."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    try:
        plain = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return False, None
    if not _same_shape(value, plain):  # a tuple, or a dict with non-string keys, changes in JSON
        return False, None
    return True, plain


def _same_shape(value: Any, plain: Any) -> bool:
    if isinstance(value, list):
        return isinstance(plain, list) and all(_same_shape(v, p) for v, p in zip(value, plain, strict=True))
    if isinstance(value, dict):
        return (
            isinstance(plain, dict)
            and all(isinstance(k, str) for k in value)
            and all(_same_shape(value[k], plain[k]) for k in value)
        )
    return type(value) is type(plain)


def _record(value: ast.expr, like: ast.AST) -> ast.stmt:
    call = ast.Call(ast.Name(RECORDER, ast.Load()), [value], [])
    return ast.copy_location(ast.Expr(call), like)


def _split_comparison(test: ast.expr) -> tuple[ast.expr, Any] | None:
    """(computed side, literal) of `a == literal`, `literal == a` or `a is None/True/False`."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq):
        for computed, other in ((left, right), (right, left)):
            ok, value = _literal(other)
            if ok and not _literal(computed)[0]:
                return computed, value
    if isinstance(op, ast.Is) and isinstance(right, ast.Constant):
        if right.value is None or isinstance(right.value, bool):
            return left, right.value
    return None


def _lift_statement(stmt: ast.stmt) -> tuple[ast.stmt, Any] | None:
    """The recording statement that replaces `stmt` and the literal it took out, if liftable."""
    if isinstance(stmt, ast.Assert):
        split = _split_comparison(stmt.test)
        if split is not None:
            return _record(split[0], stmt), split[1]
        return None
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
        return None
    args = call.args
    if call.keywords or any(isinstance(a, ast.Starred) for a in args):
        return None
    if func.attr in _ASSERT_EQUAL and len(args) == 2:
        for computed, other in ((args[0], args[1]), (args[1], args[0])):
            ok, value = _literal(other)
            if ok and not _literal(computed)[0]:
                return _record(computed, stmt), value
    if func.attr == "assertIsNone" and len(args) == 1:
        return _record(args[0], stmt), None
    return None


def _lift_body(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[Any]:
    literals: list[Any] = []
    body: list[ast.stmt] = []
    for stmt in function.body:
        lifted = _lift_statement(stmt)
        if lifted is None:
            body.append(stmt)
        else:
            body.append(lifted[0])
            literals.append(lifted[1])
    function.body = body
    return literals


def lift_asserts(source: str, names: list[str]) -> Lifted:
    """`source` with the literal expectations of the tests `names` (`function` or `Class::method`)
    moved out (module docstring). A file that does not parse, or a name it does not define at the
    top level, is left as it is (the test then fails or passes in the sandbox as written)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return Lifted(source)
    top = {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    expected: dict[str, list[Any]] = {}
    for name in dict.fromkeys(names):
        owner, _, method = name.partition("::")
        node = top.get(owner)
        if method and isinstance(node, ast.ClassDef):
            node = next(
                (
                    n
                    for n in node.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method
                ),
                None,
            )
        elif method:
            node = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            expected[name] = _lift_body(node)
    if not any(expected.values()):
        return Lifted(source, expected)
    return Lifted(ast.unparse(ast.fix_missing_locations(tree)) + "\n", expected)

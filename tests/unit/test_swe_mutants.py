"""Mutation testing of the synthetic SWE problems' hidden checks (`cascade.domains.swe.TEMPLATES`).

For every bug template and parameterisation (`k`, names), the *fixed* function is mutated
mechanically with `ast` (one mutant per site and per replacement):

- arithmetic operators (also in `+=`) swapped among `+ - * / // % **`;
- comparisons swapped among `== != < <= > >=`; `and` / `or` swapped;
- integer constants moved by -1 and +1; a unary minus dropped;
- the whole body replaced by `return <value>` for each value a check expects (a hard-coded
  answer), and by `return <parameter>` for each parameter (the argument unchanged);
- two parameters swapped (`def f(b, a)` for `def f(a, b)`), for each pair.

A mutant is *killed* when one of the template's value checks (`swe.value_checks`, the execution
reward's `swe_tests`) fails on it as the sandbox's judge compares (`harness._same_value`): a
different value, an exception, or a timeout. Mutants that agree with the fixed function, by that
same comparison, on 200 random inputs of the template's argument types (plus each check's own
call) are *equivalent* and left out of the score. The score of a template is killed / non-equivalent
mutants, its worst over the parameterisations; every template must reach `MIN_SCORE`.

Each evaluation runs in-process under a `signal.setitimer` alarm (`TIME_LIMIT_S`): the code is
the project's own template functions, mutated, not policy output, so no sandbox is needed, but a
mutant must not hang the run.

`python tests/unit/test_swe_mutants.py` prints the table and writes
`bench/results/swe_mutation_scores.json`.
"""

from __future__ import annotations

import ast
import copy
import json
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from random import Random
from types import FrameType
from typing import Any

import pytest

from cascade.domains.swe import TEMPLATES, BugTemplate, value_checks
from cascade.sandbox.harness import _same_value

MIN_SCORE = 0.95
SAMPLES = 200
TIME_LIMIT_S = 0.5
MODULE = "src.util"

_BINOPS: tuple[type[ast.operator], ...] = (
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
)
_CMPOPS: tuple[type[ast.cmpop], ...] = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_BOOLOPS: tuple[type[ast.boolop], ...] = (ast.And, ast.Or)


# --------------------------------------------------------------------------- inputs


def _ints(rng: Random, lo: int = -6, hi: int = 12) -> int:
    return rng.randint(lo, hi)


def _list(rng: Random, *, min_len: int = 0, max_len: int = 5) -> list[int]:
    return [rng.randint(-6, 9) for _ in range(rng.randint(min_len, max_len))]


def _ordered(rng: Random) -> tuple[int, int]:
    low = rng.randint(-6, 8)
    return low, low + rng.randint(0, 6)


def _clamp_args(rng: Random) -> tuple[Any, ...]:
    low, high = _ordered(rng)
    return (rng.randint(low - 4, high + 4), low, high)


def _first_n_args(rng: Random) -> tuple[Any, ...]:
    xs = _list(rng)
    return (xs, rng.randint(0, len(xs) + 2))


def _index_args(rng: Random) -> tuple[Any, ...]:
    xs = _list(rng, max_len=6)
    return (xs, rng.choice(xs) if xs and rng.random() < 0.7 else rng.randint(-6, 9))


# Random valid arguments (per the docstring) of each template, by its first name; given `k`.
ARGS: dict[str, Callable[[Random, int], tuple[Any, ...]]] = {
    "sum_to": lambda rng, k: (rng.randint(0, 25),),
    "last": lambda rng, k: (_list(rng, min_len=1),),
    "count_below": lambda rng, k: (_list(rng), _ints(rng)),
    "first_n": lambda rng, k: _first_n_args(rng),
    "add": lambda rng, k: (_ints(rng, -30, 30), _ints(rng, -30, 30)),
    "mean": lambda rng, k: (_list(rng, min_len=1),),
    "area": lambda rng, k: (_ints(rng, 0, 20), _ints(rng, 0, 20)),
    "scale": lambda rng, k: (_ints(rng, -30, 30),),
    "largest": lambda rng, k: (_list(rng, min_len=1),),
    "is_adult": lambda rng, k: (rng.randint(k - 4, k + 4) if rng.random() < 0.7 else rng.randint(0, 90),),
    "in_range": lambda rng, k: (_ints(rng, -6, 8), *_ordered(rng)),
    "is_even": lambda rng, k: (_ints(rng, -20, 20),),
    "count_positive": lambda rng, k: (_list(rng),),
    "index_of": lambda rng, k: _index_args(rng),
    "clamp": lambda rng, k: _clamp_args(rng),
    "absolute": lambda rng, k: (_ints(rng, -20, 20),),
}


# --------------------------------------------------------------------------- mutants


@dataclass(frozen=True)
class Mutant:
    label: str
    tree: ast.FunctionDef


class _SiteMutator(ast.NodeTransformer):
    """Applies the `target`-th candidate replacement (counting over the whole tree, in visit order)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.seen = 0
        self.label = ""

    def _hit(self, label: str) -> bool:
        hit = self.seen == self.target
        self.seen += 1
        if hit:
            self.label = label
        return hit

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        for op in _BINOPS:
            if not isinstance(node.op, op) and self._hit(f"{type(node.op).__name__}->{op.__name__}"):
                node.op = op()
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        self.generic_visit(node)
        for op in _BINOPS:
            if not isinstance(node.op, op) and self._hit(f"{type(node.op).__name__}=->{op.__name__}="):
                node.op = op()
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        for i, current in enumerate(node.ops):
            for op in _CMPOPS:
                if not isinstance(current, op) and self._hit(f"{type(current).__name__}->{op.__name__}"):
                    node.ops[i] = op()
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        for op in _BOOLOPS:
            if not isinstance(node.op, op) and self._hit(f"{type(node.op).__name__}->{op.__name__}"):
                node.op = op()
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.USub) and self._hit("drop unary -"):
            return node.operand
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if type(node.value) is int:
            for delta in (-1, 1):
                if self._hit(f"{node.value}->{node.value + delta}"):
                    return ast.Constant(node.value + delta)
        return node


def _function(source: str) -> ast.FunctionDef:
    tree = ast.parse(source)
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    return node


def mutants(fixed_source: str, expected: Sequence[Any], tested: Sequence[Any] = ()) -> Iterator[Mutant]:
    """Every mechanical mutant of the one function in `fixed_source` (module docstring);
    `expected` and `tested` are the values it may return as constants (the checks' expected
    outputs, their arguments)."""
    base = _function(fixed_source)
    target = 0
    while True:
        mutator = _SiteMutator(target)
        tree = mutator.visit(copy.deepcopy(base))
        if target >= mutator.seen:
            break
        yield Mutant(mutator.label, tree)
        target += 1
    params = [a.arg for a in base.args.args]
    returns: list[tuple[str, ast.expr]] = []
    for value in dict.fromkeys(repr(v) for v in [*expected, *tested]):  # each value once
        returns.append((f"return {value}", ast.parse(value, mode="eval").body))
    returns += [(f"return {p}", ast.Name(p, ast.Load())) for p in params]
    for label, expr in returns:
        tree = copy.deepcopy(base)
        tree.body = [ast.Return(expr)]
        yield Mutant(label, tree)
    for i in range(len(params)):
        for j in range(i + 1, len(params)):
            tree = copy.deepcopy(base)
            args = tree.args.args
            args[i], args[j] = args[j], args[i]
            yield Mutant(f"swap {params[i]}, {params[j]}", tree)


# --------------------------------------------------------------------------- running


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Timeout


_RAISED = object()


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`fn(*args)` made plain JSON data, or `_RAISED` (an exception or over `TIME_LIMIT_S`)."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    try:
        return json.loads(json.dumps(fn(*copy.deepcopy(args))))
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        return _RAISED
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _compile(tree: ast.FunctionDef) -> Callable[..., Any]:
    module = ast.fix_missing_locations(ast.Module([tree], []))
    namespace: dict[str, Any] = {}
    exec(compile(module, "<mutant>", "exec"), namespace)
    return namespace[tree.name]  # type: ignore[no-any-return]


def _same(got: Any, expected: Any) -> bool:
    if got is _RAISED or expected is _RAISED:
        return got is expected
    return _same_value(got, expected)


@dataclass
class Score:
    template: str
    params: dict[str, str]
    mutants: int
    equivalent: int
    killed: int
    survivors: list[str]

    @property
    def score(self) -> float:
        live = self.mutants - self.equivalent
        return self.killed / live if live else 1.0


def render(template: BugTemplate, params: dict[str, str], line: str) -> str:
    """The template's function with `line` (`template.buggy` / `.fixed`) in, as `draw_swe_problem`
    renders it."""
    return template.code.replace("{line}", line.format(**params)).format(**params)


def _arguments(call: str) -> tuple[Any, ...]:
    """The argument values of a check's call `f(<expressions>)` (our own template text)."""
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call) and not node.keywords, call
    return tuple(eval(ast.unparse(arg), {}) for arg in node.args)


def score_template(template: BugTemplate, params: dict[str, str], seed: int = 0) -> Score:
    fixed_source = render(template, params, template.fixed)
    tests = [t.format(**params) for t in template.tests]
    checks = value_checks(fixed_source, MODULE, tests)
    # The checks' calls as argument tuples (each is `f(<literals>)`), added to the random sample.
    calls = [_arguments(c["expr"]) for c in checks]
    rng = Random(seed)
    k = int(params["k"])
    sample = calls + [ARGS[template.names[0]](rng, k) for _ in range(SAMPLES)]
    fixed = _compile(_function(fixed_source))
    reference = [_call(fixed, args) for args in sample]
    expected = [c["output"] for c in checks]
    total = equivalent = killed = 0
    survivors: list[str] = []
    for mutant in mutants(fixed_source, expected, [a for args in calls for a in args]):
        total += 1
        fn = _compile(mutant.tree)
        outputs = [_call(fn, args) for args in calls]
        if not all(_same(got, want) for got, want in zip(outputs, expected, strict=True)):
            killed += 1
            continue
        rest = (_call(fn, args) for args in sample[len(calls) :])
        if all(_same(got, want) for got, want in zip(rest, reference[len(calls) :], strict=True)):
            equivalent += 1
        else:
            survivors.append(mutant.label)
    return Score(template.names[0], params, total, equivalent, killed, survivors)


def parameterisations(template: BugTemplate) -> list[dict[str, str]]:
    """Every `k`, with the first and last function / list names (names do not change behaviour)."""
    return [
        {"f": f, "xs": xs, "k": str(k)}
        for k in template.ks
        for f, xs in ((template.names[0], "xs"), (template.names[-1], "nums"))
    ]


def worst(template: BugTemplate) -> Score:
    return min((score_template(template, p) for p in parameterisations(template)), key=lambda s: s.score)


# --------------------------------------------------------------------------- tests


def test_every_template_has_an_input_generator() -> None:
    assert {t.names[0] for t in TEMPLATES} == set(ARGS)
    assert len({t.names[0] for t in TEMPLATES}) == len(TEMPLATES)


def test_mutants_cover_the_operators() -> None:
    labels = {m.label for m in mutants("def f(a, b):\n    return a / b if a >= 1 and b else -a\n", [2])}
    assert {"Div->FloorDiv", "GtE->Gt", "GtE->Eq", "And->Or", "1->0", "1->2", "drop unary -"} <= labels
    assert {"return 2", "return a", "return b", "swap a, b"} <= labels


def test_equivalent_mutants_are_not_counted() -> None:
    template = BugTemplate(
        "wrong_operator",
        ("add",),
        "def {f}(a, b):\n    return {line}\n",
        "a - b",
        "a + b",
        ("{f}(2, 3) == 5",),
    )
    score = score_template(template, {"f": "add", "xs": "xs", "k": "0"})
    assert score.equivalent >= 1  # swap a, b
    assert "swap a, b" not in score.survivors


def test_timeouts_kill() -> None:
    assert _call(lambda: [0 for _ in iter(int, 1)], ()) is _RAISED


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.names[0] for t in TEMPLATES])
def test_fixed_passes_every_check_and_buggy_fails_one(template: BugTemplate) -> None:
    for params in parameterisations(template):
        tests = [t.format(**params) for t in template.tests]
        fixed: dict[str, Any] = {}
        exec(render(template, params, template.fixed), fixed)
        assert all(eval(test, fixed) for test in tests), params
        checks = value_checks(render(template, params, template.fixed), MODULE, tests)
        buggy = _compile(_function(render(template, params, template.buggy)))
        outputs = [_call(buggy, _arguments(c["expr"])) for c in checks]
        assert not all(_same(got, c["output"]) for got, c in zip(outputs, checks, strict=True)), params


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.names[0] for t in TEMPLATES])
def test_hidden_checks_kill_the_mutants(template: BugTemplate) -> None:
    for params in parameterisations(template):
        score = score_template(template, params)
        assert score.score >= MIN_SCORE, (
            f"{template.names[0]} {params}: {score.killed}/{score.mutants - score.equivalent} "
            f"mutants killed; survivors {score.survivors}"
        )


# --------------------------------------------------------------------------- table


def main() -> int:
    rows: list[dict[str, Any]] = []
    for template in TEMPLATES:
        s = worst(template)
        rows.append(
            {
                "template": s.template,
                "kind": template.kind,
                "checks": len(template.tests),
                "mutants": s.mutants,
                "equivalent": s.equivalent,
                "killed": s.killed,
                "score": round(s.score, 4),
                "worst_params": s.params,
                "survivors": s.survivors,
            }
        )
        print(
            f"{s.template:15} {template.kind:17} checks {len(template.tests):2}  mutants {s.mutants:3}  "
            f"equivalent {s.equivalent:2}  killed {s.killed:3}  score {s.score:6.1%}  {s.survivors}"
        )
    out = Path(__file__).resolve().parents[2] / "bench" / "results" / "swe_mutation_scores.json"
    out.write_text(
        json.dumps({"min_score": MIN_SCORE, "samples": SAMPLES, "templates": rows}, indent=2) + "\n"
    )
    print(f"wrote {out}")
    return 0 if all(r["score"] >= MIN_SCORE for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

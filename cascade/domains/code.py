"""Code domain: infer a hidden integer function from three examples and write it in Python.

A prompt shows `f(2)=5 f(7)=10 f(0)=3. Write f.`; the reference answer is one canonical
program per family (`def f(x):\\n    return x+3`). The verifier runs the program on the three
shown and three hidden inputs in the sandbox (`cascade.sandbox.jobs`). The shown examples
are chosen so that no other function of the families agrees with them but differs on the
hidden inputs: a correct answer is inferable.

Rewards (a problem's `meta["n_shown"]` first tests are the ones its prompt shows; 0 if unset):
- `all_pass`: 1 when every test passes, else 0 (stopping at the first failure);
- `pass_fraction`: pays only for what the prompt did not give away. The shown tests are
  required but not paid: unless every one of them passes the reward is 0; then it is the share
  of the hidden tests passed (1 when all pass; a problem with no hidden test pays 1 only when
  all pass). A lookup table of the shown examples earns 0, not 3/6.
Values compare exactly for ints and bools and within 1e-6 relative for floats
(`cascade.sandbox.harness._same_value`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from random import Random

from cascade.config import CodeReward
from cascade.domains.base import (
    INFRA_ERROR,
    NO_ANSWER,
    OK,
    Problem,
    RewardVerdict,
)
from cascade.domains.common import Candidate, generate_problems
from cascade.model.chat import strip_thinking
from cascade.sandbox.jobs import BwrapSettings, ExecResult, Job, SandboxLimits, resolve_backend, run_jobs


@dataclass(frozen=True)
class Family:
    """Functions `x -> body(x, k)` for k in `ks`, written canonically as `return <body>`."""

    body: str
    """Python expression in `x` and `{k}`."""
    ks: tuple[int, ...] = (0,)

    def functions(self) -> list[tuple[str, Callable[[int], int]]]:
        """(canonical expression, callable) for every k."""
        allowed = {"__builtins__": {"max": max, "min": min, "abs": abs}}
        exprs = [self.body.format(k=k) for k in self.ks]
        return [(expr, eval(f"lambda x: {expr}", allowed)) for expr in exprs]


# Sized for a sub-1M-parameter model: a few regular families with small constants (about 50
# functions), so supervised tuning gets it started within minutes and RL has room to improve.
FAMILIES: tuple[Family, ...] = (
    Family("x+{k}", tuple(range(1, 7))),
    Family("x-{k}", tuple(range(1, 7))),
    Family("{k}-x", tuple(range(5, 11))),
    Family("x*{k}", tuple(range(2, 7))),
    Family("x*x"),
    Family("x*x+{k}", tuple(range(1, 6))),
    Family("x//{k}", tuple(range(2, 6))),
    Family("x%{k}", tuple(range(2, 6))),
    Family("max(x,{k})", tuple(range(3, 9))),
    Family("2*x+{k}", tuple(range(1, 6))),
)

_BY_FAMILY = [family.functions() for family in FAMILIES]
_ALL = [fn for functions in _BY_FAMILY for fn in functions]


def reference_program(expr: str) -> str:
    return f"def f(x):\n    return {expr}"


def draw_code_problem(rng: Random) -> Candidate:
    """A family member, 3 shown inputs in 0..12 (ascending, so a tiny model can read the
    pattern) and 3 hidden ones in 0..30, identifiable from the shown ones."""
    while True:
        family = rng.randrange(len(FAMILIES))
        expr, fn = rng.choice(_BY_FAMILY[family])
        inputs = sorted(rng.sample(range(0, 13), 3))
        hidden = rng.sample([x for x in range(0, 31) if x not in inputs], 3)
        if _identifiable(fn, inputs, hidden):
            break
    shown = " ".join(f"f({x})={fn(x)}" for x in inputs)
    tests = [{"input": x, "output": fn(x)} for x in inputs + hidden]
    meta = {"tests": tests, "entry_point": "f", "n_shown": 3, "family": FAMILIES[family].body}
    return f"{shown}. Write f.", reference_program(expr), meta


def _identifiable(fn: Callable[[int], int], shown: list[int], hidden: list[int]) -> bool:
    """Every family function agreeing with `fn` on `shown` also agrees on `hidden`."""
    target = [fn(x) for x in shown]
    expected = [fn(x) for x in hidden]
    for _, other in _ALL:
        if [other(x) for x in shown] == target and [other(x) for x in hidden] != expected:
            return False
    return True


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The program in a completion: the first ``` fenced block if any, else the whole response."""
    response = strip_thinking(completion)
    match = _FENCE.search(response)
    code = match.group(1) if match else response
    return code.strip("\n").rstrip()


class CodeDomain:
    """The code domain: problems plus a sandboxed unit-test scorer."""

    name = "code"

    def __init__(self, config: CodeReward | None = None, *, workers: int = 2) -> None:
        self.config = config or CodeReward()
        self.workers = workers
        """Programs run in parallel by the harness (2 cores here)."""
        self.limits = SandboxLimits(
            time_limit_s=self.config.time_limit_s,
            memory_mb=self.config.memory_mb,
            max_output_bytes=self.config.max_output_bytes,
            max_processes=self.config.max_processes,
        )
        self.settings = BwrapSettings(uid=self.config.sandbox_uid)

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return generate_problems(self.name, split, n, seed, draw_code_problem)

    def prepare(self) -> None:
        """Start the sandbox now (`SandboxUnavailable` saying what the host lacks; a config
        that asks for `sandbox: process` gets its one warning instead)."""
        resolve_backend(self.config.sandbox, self.workers, self.settings)

    def score(self, problem: Problem, completion: str) -> RewardVerdict:
        return self.score_batch([problem], [completion])[0]

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        all_pass = self.config.mode == "all_pass"
        verdicts: list[RewardVerdict | None] = [None] * len(problems)
        jobs: list[Job] = []
        slots: list[int] = []
        for i, (problem, completion) in enumerate(zip(problems, completions, strict=True)):
            code = extract_code(completion)
            tests = problem.meta.get("tests")
            if not code:
                verdicts[i] = RewardVerdict(0.0, NO_ANSWER, "no code in the response")
            elif not tests:
                verdicts[i] = RewardVerdict(0.0, INFRA_ERROR, f"problem {problem.id} has no tests")
            else:
                jobs.append(Job(code, tests, problem.meta.get("entry_point"), stop_on_failure=all_pass))
                slots.append(i)
        results = run_jobs(
            jobs, self.limits, workers=self.workers, backend=self.config.sandbox, settings=self.settings
        )
        for i, result in zip(slots, results, strict=True):
            verdicts[i] = self._verdict(result, all_pass, problems[i].meta.get("n_shown", 0))
        return [v for v in verdicts if v is not None]

    @staticmethod
    def _verdict(result: ExecResult, all_pass: bool, n_shown: object = 0) -> RewardVerdict:
        if result.status == INFRA_ERROR:
            return RewardVerdict(0.0, INFRA_ERROR, result.detail)
        if result.status == OK:
            return RewardVerdict(1.0, OK)
        detail = f"{result.passed}/{result.total} passed; {result.detail}"
        if all_pass:
            return RewardVerdict(0.0, result.status, detail)
        if type(n_shown) is not int or not 0 <= n_shown <= result.total:  # the problem's fault
            return RewardVerdict(0.0, INFRA_ERROR, f"bad n_shown {n_shown!r} for {result.total} tests")
        reward, counted = hidden_fraction(result.passed_tests, n_shown, result.total)
        return RewardVerdict(reward, result.status, f"{counted}; {detail}")


def hidden_fraction(passed_tests: Sequence[int], n_shown: int, total: int) -> tuple[float, str]:
    """`pass_fraction`'s reward for a program that did not pass every test, and why: 0 unless
    all `n_shown` shown tests passed, else the share of the hidden ones passed."""
    passed = set(passed_tests)
    shown_passed = sum(1 for n in range(n_shown) if n in passed)
    if shown_passed < n_shown:
        return 0.0, f"{shown_passed}/{n_shown} shown tests passed (all are required)"
    hidden = total - n_shown
    hidden_passed = sum(1 for n in range(n_shown, total) if n in passed)
    if hidden == 0:
        return 0.0, "no hidden test"
    return hidden_passed / hidden, f"{hidden_passed}/{hidden} hidden tests passed"

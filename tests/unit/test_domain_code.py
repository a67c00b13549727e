"""Code domain: generation, identifiability, code extraction and sandboxed scoring."""

from __future__ import annotations

import pytest

from cascade.config import CodeReward
from cascade.domains.base import (
    INFRA_ERROR,
    NO_ANSWER,
    OK,
    PARSE_ERROR,
    RUNTIME_ERROR,
    TIMEOUT,
    WRONG_ANSWER,
    Problem,
)
from cascade.domains.code import FAMILIES, CodeDomain, extract_code


def _problem(tests: list[dict[str, int]] | None = None) -> Problem:
    tests = tests if tests is not None else [{"input": x, "output": x + 1} for x in range(6)]
    return Problem(
        id="code-test-0",
        domain="code",
        prompt="f(0)=1 f(1)=2 f(2)=3. Write f.",
        answer="def f(x):\n    return x+1",
        meta={"tests": tests, "entry_point": "f"},
    )


def test_problems_deterministic_short_and_disjoint() -> None:
    d = CodeDomain()
    a = d.make_problems("train", 300, seed=1)
    assert a == d.make_problems("train", 300, seed=1)
    assert a != d.make_problems("train", 300, seed=2)
    evals = d.make_problems("eval", 200, seed=1)
    sft = d.make_problems("sft", 200, seed=1)
    prompts = [{p.prompt for p in ps} for ps in (a, evals, sft)]
    assert [len(s) for s in prompts] == [300, 200, 200]
    assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2] and not prompts[1] & prompts[2]
    assert evals[7].id == "code-eval-7"
    for p in a + evals:
        assert len(p.prompt) <= 80 and len(p.answer) <= 40, p
        assert p.prompt.endswith(". Write f.")
        assert p.answer.startswith("def f(x):\n    return ")
        tests = p.meta["tests"]
        assert len(tests) == 6 and p.meta["entry_point"] == "f"
        shown = " ".join(f"f({t['input']})={t['output']}" for t in tests[:3])
        assert p.prompt == f"{shown}. Write f."
        assert len({t["input"] for t in tests}) == 6
    assert len({p.meta["family"] for p in a}) == len(FAMILIES)


def test_shown_examples_identify_the_function() -> None:
    """Another family member fitting the shown examples must fit the hidden ones too."""
    from cascade.domains.code import _ALL

    for p in CodeDomain().make_problems("train", 300, 0):
        tests = p.meta["tests"]
        for _, fn in _ALL:
            if all(fn(t["input"]) == t["output"] for t in tests[:3]):
                assert all(fn(t["input"]) == t["output"] for t in tests[3:]), p


def test_every_reference_answer_scores_one() -> None:
    d = CodeDomain()
    problems = d.make_problems("train", 250, 0) + d.make_problems("eval", 100, 0)
    verdicts = d.score_batch(problems, [p.answer for p in problems])
    assert {v.reason for v in verdicts} == {OK}
    assert all(v.reward == 1.0 for v in verdicts)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("```python\ndef f(x):\n    return x+1\n```", "def f(x):\n    return x+1"),
        ("Here:\n```\ndef f(x):\n    return 1+x\n```\nDone.", "def f(x):\n    return 1+x"),
        ("<think>hmm</think>def f(x):\n    return x+1\n", "def f(x):\n    return x+1"),
        ("```py\ndef f(x):\n    return x", "def f(x):\n    return x"),
        ("   \n", ""),
    ],
)
def test_extract_code(completion: str, expected: str) -> None:
    assert extract_code(completion) == expected


def test_correct_and_incorrect_answers() -> None:
    d = CodeDomain(CodeReward(time_limit_s=1.0))
    cases = [
        ("def f(x):\n    return x+1", OK, 1.0),
        ("```python\ndef f(x):\n    return 1+x\n```", OK, 1.0),
        ("def f(x):\n    return x+2", WRONG_ANSWER, 0.0),
        ("def f(x):\n    return x+1 if x < 3 else 0", WRONG_ANSWER, 0.0),
        ("def f(x):\n    return x+", PARSE_ERROR, 0.0),
        ("def g(x):\n    return x+1", PARSE_ERROR, 0.0),
        ("def f(x):\n    return 1/0", RUNTIME_ERROR, 0.0),
        ("def f(x):\n    while True:\n        pass", TIMEOUT, 0.0),
        ("", NO_ANSWER, 0.0),
    ]
    verdicts = d.score_batch([_problem()] * len(cases), [c for c, _, _ in cases])
    assert [(v.reason, v.reward) for v in verdicts] == [(r, w) for _, r, w in cases]
    assert "0/6 passed" in verdicts[2].detail


def test_pass_fraction_mode_gives_partial_credit() -> None:
    half = "def f(x):\n    return x+1 if x < 3 else 0"
    crash_late = "def f(x):\n    assert x < 4\n    return x+1"
    fraction = CodeDomain(CodeReward(mode="pass_fraction"))
    verdicts = fraction.score_batch([_problem()] * 3, [half, crash_late, "def f(x):\n    return x+1"])
    assert [(v.reason, v.reward) for v in verdicts] == [
        (WRONG_ANSWER, 0.5),
        (RUNTIME_ERROR, pytest.approx(4 / 6)),
        (OK, 1.0),
    ]
    all_pass = CodeDomain(CodeReward(mode="all_pass")).score_batch([_problem()], [half])[0]
    assert all_pass.reward == 0.0 and all_pass.detail.startswith("3/6 passed")  # stopped at test 3


def test_problem_without_tests_is_infra_error() -> None:
    verdict = CodeDomain().score(_problem(tests=[]), "def f(x):\n    return x+1")
    assert verdict.reason == INFRA_ERROR and verdict.is_infra_error


def _shown_problem(n_shown: object = 3) -> Problem:
    tests = [{"input": x, "output": x + 1} for x in (1, 2, 3, 10, 20, 30)]
    return Problem(
        "code-test-1",
        "code",
        "f(1)=2 f(2)=3 f(3)=4. Write f.",
        "",
        {**_problem(tests).meta, "n_shown": n_shown},
    )


def test_pass_fraction_pays_only_for_the_hidden_tests() -> None:
    """The shown examples are required but not paid: a lookup table of them earns 0, not 3/6."""
    lookup = "def f(x):\n    return {1: 2, 2: 3, 3: 4}.get(x, 0)"
    two_hidden = "def f(x):\n    return x+1 if x < 25 else 0"
    one_shown_wrong = "def f(x):\n    return x+1 if x != 2 else 0"
    slow_last = "def f(x):\n    while x > 25:\n        pass\n    return x+1"
    crash_at_20 = "def f(x):\n    assert x != 20\n    return x+1"
    cases = [
        (lookup, WRONG_ANSWER, 0.0),
        (two_hidden, WRONG_ANSWER, 2 / 3),
        (one_shown_wrong, WRONG_ANSWER, 0.0),
        (slow_last, TIMEOUT, 2 / 3),  # passes so far are kept
        (crash_at_20, RUNTIME_ERROR, 1 / 3),  # a crash ends the run
        ("def f(x):\n    return x+1", OK, 1.0),
    ]
    fraction = CodeDomain(CodeReward(mode="pass_fraction", time_limit_s=1.0))
    verdicts = fraction.score_batch([_shown_problem()] * len(cases), [c for c, _, _ in cases])
    assert [(v.reason, v.reward) for v in verdicts] == [(r, pytest.approx(w)) for _, r, w in cases]
    assert "0/3 hidden tests passed" in verdicts[0].detail
    assert "2/3 shown tests passed (all are required)" in verdicts[2].detail
    all_pass = CodeDomain(CodeReward(time_limit_s=1.0)).score_batch(
        [_shown_problem()] * 2, [lookup, two_hidden]
    )
    assert [(v.reason, v.reward) for v in all_pass] == [(WRONG_ANSWER, 0.0)] * 2


def test_pass_fraction_with_a_bad_n_shown_is_the_problems_fault() -> None:
    wrong = "def f(x):\n    return 0"
    for bad in (7, -1, "3", 2.0):
        verdict = CodeDomain(CodeReward(mode="pass_fraction")).score(_shown_problem(bad), wrong)
        assert verdict.reason == INFRA_ERROR and "n_shown" in verdict.detail, (bad, verdict)
    assert CodeDomain().score(_shown_problem("3"), wrong).reason == WRONG_ANSWER  # all-pass: unused


def test_generated_problems_pay_nothing_for_their_shown_examples() -> None:
    problem = CodeDomain().make_problems("eval", 1, 5)[0]
    shown = {t["input"]: t["output"] for t in problem.meta["tests"][: problem.meta["n_shown"]]}
    lookup = f"def f(x):\n    return {shown!r}.get(x, -1)"
    verdict = CodeDomain(CodeReward(mode="pass_fraction")).score(problem, lookup)
    assert (verdict.reason, verdict.reward) == (WRONG_ANSWER, 0.0), verdict

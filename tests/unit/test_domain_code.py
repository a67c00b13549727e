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

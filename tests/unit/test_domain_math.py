"""Math domain: generation, math-verify scoring, the off-main-thread worker, known quirks."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import cascade.domains.math as math_domain
from cascade.config import MathReward
from cascade.domains.base import INFRA_ERROR, NO_ANSWER, OK, TIMEOUT, WRONG_ANSWER, Problem, RewardVerdict
from cascade.domains.common import split_of
from cascade.domains.math import MathDomain


def _problem(answer: str = "\\boxed{85}") -> Problem:
    return Problem(id="math-test-0", domain="math", prompt="What is 47+38?", answer=answer)


def _in_thread(fn: Callable[[], Any]) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # re-raised in the test thread
            box["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def domain() -> Any:
    d = MathDomain(MathReward())
    yield d
    d.close()


# --------------------------------------------------------------------------- generation


def test_problems_deterministic_short_and_disjoint(domain: MathDomain) -> None:
    a = domain.make_problems("train", 300, seed=3)
    assert a == domain.make_problems("train", 300, seed=3)
    assert a != domain.make_problems("train", 300, seed=4)
    assert [p.id for p in a[:2]] == ["math-train-0", "math-train-1"]
    splits = {s: domain.make_problems(s, 200, seed=3) for s in ("train", "eval", "sft")}
    prompts = {s: {p.prompt for p in ps} for s, ps in splits.items()}
    assert all(len(v) == 200 for v in prompts.values())
    assert not prompts["train"] & prompts["eval"]
    assert not prompts["train"] & prompts["sft"]
    assert not prompts["eval"] & prompts["sft"]
    assert all(split_of(p) == "eval" for p in prompts["eval"])
    problems = [p for ps in splits.values() for p in ps]
    assert max(len(p.prompt) for p in problems) <= 80
    assert max(len(p.answer) for p in problems) <= 40
    word = sum(p.meta["kind"].startswith("word") for p in splits["train"]) / 200
    assert 0.15 < word < 0.45


def test_unknown_split_is_refused(domain: MathDomain) -> None:
    with pytest.raises(ValueError, match="unknown split"):
        domain.make_problems("test", 3, 0)


def test_every_reference_answer_scores_one(domain: MathDomain) -> None:
    problems = domain.make_problems("train", 300, 0) + domain.make_problems("eval", 100, 0)
    verdicts = domain.score_batch(problems, [p.answer for p in problems])
    assert [v.reason for v in verdicts] == [OK] * len(problems)
    assert all(v.reward == 1.0 for v in verdicts)


def test_word_problem_answers_are_right() -> None:
    d = MathDomain()
    kinds = set()
    for p in d.make_problems("train", 300, 1):
        a, b = (int(t) for t in re.findall(r"\d+", p.prompt))
        value = a + b if p.meta["kind"] in ("add", "word_add") else a - b
        assert p.answer == f"\\boxed{{{value}}}", p
        assert value >= 0
        kinds.add(p.meta["kind"])
    assert kinds == {"add", "sub", "word_add", "word_sub"}


# --------------------------------------------------------------------------- scoring

CASES: list[tuple[str, str]] = [
    ("\\boxed{85}", OK),
    ("The answer is \\boxed{85}.", OK),
    ("85", OK),
    ("47+38=85", OK),
    ("<think>maybe 84</think>\\boxed{85}", OK),
    ("\\boxed{84}", WRONG_ANSWER),
    ("84", WRONG_ANSWER),
    ("\\boxed{47+38}", WRONG_ANSWER),  # unevaluated (see the quirk test)
    ("47+38", WRONG_ANSWER),
    ("", NO_ANSWER),
    ("I do not know", NO_ANSWER),
    ("<think>it is 85", NO_ANSWER),  # thinking never closed: no final answer
]


def test_correct_and_incorrect_answers(domain: MathDomain) -> None:
    verdicts = domain.score_batch([_problem()] * len(CASES), [c for c, _ in CASES])
    assert [(c, v.reason) for (c, _), v in zip(CASES, verdicts, strict=True)] == CASES
    assert [v.reward for v in verdicts] == [1.0 if r == OK else 0.0 for _, r in CASES]


def test_plain_gold_answer_is_accepted(domain: MathDomain) -> None:
    assert domain.score(_problem("85"), "\\boxed{85}").reason == OK
    assert domain.score(_problem("\\frac{1}{2}"), "\\boxed{0.5}").reason == OK


def test_verdicts_are_cached(domain: MathDomain, monkeypatch: pytest.MonkeyPatch) -> None:
    domain.score(_problem(), "\\boxed{85}")
    calls: list[str] = []

    def counting_parse(text: str) -> list[Any]:
        calls.append(text)
        return []

    monkeypatch.setattr(math_domain, "_parse_answer", counting_parse)
    assert domain.score(_problem(), "\\boxed{85}").reason == OK
    assert calls == []


def test_quirk_unevaluated_expression_equals_its_value() -> None:
    """math-verify quirk: `47+38` verifies against `85`, so echoing the prompt would be rewarded.

    If this starts failing, math-verify changed and our `_unevaluated` guard may be redundant.
    """
    from math_verify import parse, verify

    assert verify(parse("\\boxed{85}"), parse("\\boxed{47+38}"))
    assert verify(parse("\\boxed{85}"), parse("47+38"))
    assert MathDomain().score(_problem(), "\\boxed{47+38}").reason == WRONG_ANSWER


def test_quirk_percent_equals_number() -> None:
    """math-verify quirk (accepted, documented): `85%` verifies against `85`."""
    from math_verify import parse, verify

    assert verify(parse("\\boxed{85}"), parse("85%"))
    assert MathDomain().score(_problem(), "85%").reason == OK


def test_quirk_last_number_wins_without_box() -> None:
    assert MathDomain().score(_problem(), "84, no wait, 85").reason == OK
    assert MathDomain().score(_problem(), "85, no wait, 84").reason == WRONG_ANSWER


def test_main_thread_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(text: str) -> list[Any]:
        time.sleep(5)
        return []

    d = MathDomain(MathReward(timeout_s=0.2))
    monkeypatch.setattr(math_domain, "_parse_answer", slow)
    start = time.monotonic()
    verdict = d.score(_problem(), "\\boxed{85} slow")
    assert verdict.reason == TIMEOUT and verdict.reward == 0.0
    assert time.monotonic() - start < 2
    assert len(d._cache) == 0  # a timeout may pass on a retry: not cached


# --------------------------------------------------------------------------- off the main thread


def test_non_main_thread_gives_the_same_verdicts(domain: MathDomain) -> None:
    problems = domain.make_problems("eval", 40, 0)
    completions = [p.answer for p in problems[:20]] + ["\\boxed{1000}"] * 10 + ["no idea"] * 10
    main = [v.reason for v in MathDomain().score_batch(problems, completions)]
    off = _in_thread(lambda: domain.score_batch(problems, completions))
    assert [v.reason for v in off] == main
    assert main == [OK] * 20 + [WRONG_ANSWER] * 10 + [NO_ANSWER] * 10
    assert domain._pool is not None  # the worker process was used
    cases = _in_thread(lambda: domain.score_batch([_problem()] * len(CASES), [c for c, _ in CASES]))
    assert [v.reason for v in cases] == [r for _, r in CASES]


def _sleep_task(gold: str, completion: str, timeout_s: float) -> tuple[str, str]:
    if "slow" in completion:
        time.sleep(60)
    return math_domain.check_answer(gold, completion, timeout_s)


def _crash_task(gold: str, completion: str, timeout_s: float) -> tuple[str, str]:
    if "crash" in completion:
        os._exit(1)
    return math_domain.check_answer(gold, completion, timeout_s)


def _score_off_thread(d: MathDomain, completions: Sequence[str]) -> list[RewardVerdict]:
    return _in_thread(lambda: d.score_batch([_problem()] * len(completions), list(completions)))


def test_worker_timeout_is_timeout_and_the_worker_restarts() -> None:
    d = MathDomain(MathReward(timeout_s=2.0), worker_grace_s=0.5)  # 2 s: an ok check under load stays ok
    try:
        d._worker_task = _sleep_task
        start = time.monotonic()
        verdicts = _score_off_thread(d, ["\\boxed{85}", "slow", "\\boxed{84}", "\\boxed{85} "])
        assert [v.reason for v in verdicts] == [OK, TIMEOUT, WRONG_ANSWER, OK]
        assert time.monotonic() - start < 30
    finally:
        d.close()


def test_worker_crash_is_infra_error_not_zero_reward() -> None:
    d = MathDomain()
    try:
        d._worker_task = _crash_task
        verdicts = _score_off_thread(d, ["\\boxed{85}", "crash", "\\boxed{84}"])
        assert [v.reason for v in verdicts] == [OK, INFRA_ERROR, WRONG_ANSWER]
        assert verdicts[1].is_infra_error
        # infra errors are not cached: the same completion is tried again
        d._worker_task = math_domain.check_answer
        assert _score_off_thread(d, ["crash"])[0].reason == NO_ANSWER
    finally:
        d.close()


# --------------------------------------------------------------------------- golds and attribution


@pytest.mark.parametrize(
    ("gold", "latex"),
    [
        ("3\\sqrt{2}", "$3\\sqrt{2}$"),
        ("85", "$85$"),
        ("\\boxed{85}", "\\boxed{85}"),
        ("$x=3$", "$x=3$"),
        ("\\(x=3\\)", "\\(x=3\\)"),
        ("\\$18.90", "$\\$18.90$"),
        ("Monday", "$\\text{Monday}$"),
        ("no solution", "$\\text{no solution}$"),
        ("C", "$C$"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "$72$"),
    ],
)
def test_gold_is_delimited_for_the_parser(gold: str, latex: str) -> None:
    assert math_domain.gold_latex(gold) == latex


def test_latex_gold_is_not_truncated_at_its_first_number(domain: MathDomain) -> None:
    """Issue 12 item 7: `3\\sqrt{2}` used to be parsed as 3 (see the regression table)."""
    problem = _problem("3\\sqrt{2}")
    assert domain.score(problem, "\\boxed{3}").reason == WRONG_ANSWER
    assert domain.score(problem, "so the answer is \\boxed{3\\sqrt{2}}").reason == OK


def test_boxed_contents_and_several_boxes_as_one_set() -> None:
    assert math_domain.boxed_contents("\\boxed{\\{1,2\\}} and \\boxed{\\frac{1}{2}}") == [
        "\\{1,2\\}",
        "\\frac{1}{2}",
    ]
    assert math_domain.boxed_contents("\\boxed 3 or \\boxed{3\\sqrt2}, \\boxed{unclosed") == ["3", "3\\sqrt2"]
    assert math_domain.answer_text("$\\boxed{4}$, no: $\\boxed{5}$") == "\\boxed{4}\n\\boxed{5}"
    assert math_domain.answer_text("\\boxed{5}, again \\boxed{ 5 }") == "\\boxed{5}"
    assert math_domain.answer_text("just \\boxed{5}") == "just \\boxed{5}"


def test_a_parser_failure_on_the_answer_is_a_verdict_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = math_domain._parse_answer

    def fragile(text: str) -> list[Any]:
        if "boom" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return real(text)

    monkeypatch.setattr(math_domain, "_parse_answer", fragile)
    verdict = MathDomain().score(_problem(), "\\boxed{boom}")
    assert (verdict.reason, verdict.reward) == ("parse_error", 0.0)
    assert not verdict.is_infra_error


def test_an_unparseable_gold_is_the_platforms_failure() -> None:
    for gold in ("", "\\text{}"):
        verdict = MathDomain().score(_problem(gold), "\\boxed{1}")
        assert verdict.is_infra_error and "gold answer" in verdict.detail


def test_repeating_decimals_are_fractions() -> None:
    assert math_domain.normalise_notation("0.1\\overline{6}") == "\\frac{15}{90}"
    assert math_domain.normalise_notation("-2.\\overline{142857}") == "-\\frac{2142855}{999999}"
    assert math_domain.normalise_notation("\\text{\\$}42") == "\\$42"


def test_the_deadline_fires_again_when_its_first_raise_is_swallowed() -> None:
    """A timeout raised inside a gc/weakref callback is swallowed by the interpreter; the alarm
    re-arms itself until the check is really stopped, and nothing is left armed afterwards."""
    import signal
    import time

    from cascade.domains.math import _deadline, _VerifyTimeout

    swallowed = 0
    with pytest.raises(_VerifyTimeout):
        with _deadline(0.05):
            while True:
                try:
                    time.sleep(0.001)
                except _VerifyTimeout:
                    swallowed += 1  # as the interpreter does with a raise in a gc callback
                    if swallowed == 2:
                        raise
    # the first raise was swallowed and a later one stopped the block (the re-armed alarm may
    # land in the handler itself, before the count: that is a second raise too)
    assert swallowed >= 1
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_timeout_swallowed_in_a_weakref_callback_is_not_reported_as_unraisable() -> None:
    """The interpreter hands a raise inside a weakref callback to `sys.unraisablehook` (pytest
    fails the test that was running; a service logs a crash). Our own timeout there is expected:
    the deadline drops it, still stops the check, and passes any other unraisable on."""
    import signal
    import sys
    import time
    import weakref

    from cascade.domains.math import _deadline, _VerifyTimeout

    class Target:
        pass

    callback: list[str] = []

    def slow_callback(ref: object) -> None:
        callback.append("started")
        started = time.monotonic()
        while time.monotonic() - started < 2.0:  # the alarm fires in here
            pass
        callback.append("finished")

    def failing_callback(ref: object) -> None:
        raise KeyError("not ours")

    reported: list[BaseException | None] = []
    outer_hook = sys.unraisablehook

    def record(unraisable: object) -> None:
        reported.append(unraisable.exc_value)  # type: ignore[attr-defined]

    target, other = Target(), Target()
    ref = weakref.ref(target, slow_callback)
    other_ref = weakref.ref(other, failing_callback)
    sys.unraisablehook = record
    try:
        with pytest.raises(_VerifyTimeout):
            with _deadline(0.3):
                del other  # its callback raises: not ours, reported
                del target  # its callback runs now and swallows the first raise
                while True:
                    time.sleep(0.001)
        hook_after = sys.unraisablehook
    finally:
        sys.unraisablehook = outer_hook
    assert callback == ["started"]  # stopped by the deadline, inside the callback
    assert [type(exc) for exc in reported] == [KeyError]
    assert ref() is None and other_ref() is None
    assert hook_after is record
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)

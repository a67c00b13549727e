"""The judge's reading of what a program sends, and the value comparison both backends share.

Every reply the program process can write (it holds the pipe) is a verdict on the program: the
right answer, a wrong answer, or its runtime error. None may raise in the judge (which the
worker would report as `infra_error`, masking the sample out of training and its penalty).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from cascade.sandbox import judge
from cascade.sandbox.harness import _same_value

RT, WA = "runtime_error", "wrong_answer"


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ({"value": 5}, None),
        ({"value": 5.0}, None),  # an integral float for an int: Python's == (documented)
        ({"value": 5.000001}, WA),
        ({"value": True}, WA),
        ({"value": "5"}, WA),
        ({"value": [5]}, WA),
        ({"value": None}, WA),
        ({"value": math.nan}, WA),
        ({"value": math.inf}, WA),
        ({"value": 10**400}, WA),
        ({"value": {"5": 5}}, WA),
        ({"err": ["wrong_answer", "returned an unserialisable set"]}, WA),
        ({"err": ["runtime_error", "ZeroDivisionError"]}, RT),
        ({"err": ["memory_limit", "MemoryError"]}, "memory_limit"),
        ({"err": ["ok", "trust me"]}, RT),
        ({"err": ["timeout", "not mine"]}, RT),
        ({"err": ["infra_error", "blame the sandbox"]}, RT),
        ({"err": [["runtime_error"], "x"]}, RT),  # unhashable reason: raised in the judge before
        ({"err": [{"a": 1}, "x"]}, RT),
        ({"err": ["runtime_error", {"a": 1}]}, RT),
        ({"err": ["runtime_error", "a", "b"]}, RT),
        ({"err": ["runtime_error"]}, RT),
        ({"err": "runtime_error"}, RT),
        ({"err": None}, RT),
        ({"value": 5, "err": ["runtime_error", "x"]}, RT),
        ({"value": 5, "extra": 1}, RT),
        ({"stdout": "5"}, RT),
        ({"loaded": True}, RT),
        ({}, RT),
        ([5], RT),
        (None, RT),
        (5, RT),
        ("5", RT),
    ],
)
def test_value_reply_verdicts(reply: Any, verdict: str | None) -> None:
    failure = judge._judged(judge._judge_value, reply, 0, 5, "f(1)")
    assert (failure[0] if failure else None) == verdict, failure


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ({"stdout": "9\ndone\n"}, None),
        ({"stdout": "9\ndone  \n\n"}, None),  # trailing whitespace is ignored
        ({"stdout": "9"}, WA),
        ({"stdout": ["9", "done"]}, RT),
        ({"stdout": None}, RT),
        ({"stdout": 9}, RT),
        ({"value": "9\ndone"}, RT),
        ({"err": ["output_limit", "more than 4096 bytes"]}, "output_limit"),
    ],
)
def test_stdout_reply_verdicts(reply: Any, verdict: str | None) -> None:
    failure = judge._judged(judge._judge_stdout, reply, 0, "9\ndone")
    assert (failure[0] if failure else None) == verdict, failure


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ({"loaded": True}, None),
        ({"loaded": 1}, RT),
        ({"loaded": [1]}, RT),
        ({"loaded": "yes"}, RT),
        ({"loaded": True, "value": 1}, RT),
        ({"err": ["parse_error", "SyntaxError: invalid syntax"]}, "parse_error"),
        ({"value": 5}, RT),
    ],
)
def test_loaded_reply_verdicts(reply: Any, verdict: str | None) -> None:
    failure = judge._judged(judge._judge_loaded, reply)
    assert (failure[0] if failure else None) == verdict, failure


def test_an_error_while_judging_is_the_programs_runtime_error() -> None:
    def broken(reply: Any) -> None:
        raise KeyError("anything the judge did not foresee")

    assert judge._judged(broken, {"value": 1}) == (
        RT,
        "the judge could not read the program's reply (KeyError)",
    )


def test_claimed_failure_detail_is_cleaned() -> None:
    failure = judge._judged(
        judge._judge_value, {"err": ["runtime_error", "\x1b[2J\ud800" + "x" * 5000]}, 0, 5, ""
    )
    assert failure is not None and failure[0] == RT
    failure[1].encode("utf-8")
    assert len(failure[1]) <= 300 and "\x1b" not in failure[1]


@pytest.mark.parametrize(
    ("got", "expected", "same"),
    [
        # ints: exactly (an integral float of exactly that value passes, as in Python)
        (123456789, 123456789, True),
        (123456789.0, 123456789, True),
        (123456789.0 + 89, 123456789, False),  # within 1e-6 relative: no longer passes
        (123456878, 123456789, False),
        (2**53 + 1, 2**53 + 1, True),
        (float(2**53 + 1), 2**53 + 1, False),  # the float is 2**53: not that int
        (3.0000001, 3, False),
        (-0.0, 0, True),
        # bools only as bools
        (True, 1, False),
        (1, True, False),
        (0.0, False, False),
        (True, True, True),
        ([True, 0], [1, 0], False),
        ({"a": True}, {"a": 1}, False),
        # floats: within 1e-6 relative (1e-9 absolute), ints count as floats
        (0.1 + 0.2, 0.3, True),
        (1.0000009, 1.0, True),
        (1.000002, 1.0, False),
        (1e-10, 0.0, True),
        (2, 2.0, True),
        (math.inf, math.inf, True),
        (-math.inf, math.inf, False),
        (1e308, math.inf, False),
        (math.nan, math.nan, True),
        (math.nan, 1.0, False),
        (1.0, math.nan, False),
        ("1.0", 1.0, False),
        (10**400, 1.0, False),
        # containers: by shape, then item by item, at any depth
        ([1, 2], [1, 2], True),
        ((1, 2), [1, 2], True),  # a tuple is a JSON list
        ([1, 2, 3], [1, 2], False),
        ([1], [1, 2], False),
        ([[1.0000001]], [[1.0]], True),
        ([[1.0000001]], [[1]], False),
        ({"a": [1]}, {"a": [1]}, True),
        ({"a": [1], "b": 2}, {"a": [1]}, False),
        ({1: 2}, {"1": 2}, True),  # JSON keys are strings
        (None, None, True),
        (None, 0, False),
        ("abc", "abc", True),
        ("abc ", "abc", False),
        ({1, 2}, [1, 2], False),  # not JSON data
    ],
)
def test_same_value_rules(got: Any, expected: Any, same: bool) -> None:
    assert _same_value(got, expected) is same


def test_same_value_survives_hostile_values() -> None:
    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    assert _same_value(Liar(-1), 5) is False
    assert _same_value(deep, [1]) is False
    assert _same_value(10**5000, 1) is False

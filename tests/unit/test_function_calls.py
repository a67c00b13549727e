"""The function-call matcher (BFCL's AST-check idea) on BFCL-shaped fixture rows
(tests/data/hf/bfcl/train.jsonl: `question` as turns of messages, `function` docs as JSON schemas
with BFCL's `dict`/`float` types, `ground_truth` with accepted values per parameter, as JSON
text), loaded through the `kind: hf` source with the `bfcl` adapter and scored by the agent
domain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from cascade.config import parse_domain_config
from cascade.config.hf import HfPrompts
from cascade.domains import load_problems
from cascade.domains.agent import AgentDomain, default_format
from cascade.domains.base import NO_ANSWER, OK, PARSE_ERROR, WRONG_ANSWER, Problem
from cascade.domains.function_calls import match_call, value_accepted
from cascade.domains.hf_source import load_hf
from cascade.tools.template import ToolCallText

DATA = Path(__file__).resolve().parents[1] / "data" / "hf" / "bfcl" / "train.jsonl"
SOURCE = {"kind": "hf", "adapter": "bfcl", "data_files": {"train": [str(DATA)]}, "n_eval": 1}
FMT = default_format()


@pytest.fixture(scope="module")
def rows() -> dict[str, Problem]:
    domain = parse_domain_config({"name": "agent", "prompts": SOURCE})
    problems = load_problems(domain, "train") + load_problems(domain, "eval")
    return {p.id: p for p in problems}


def test_adapter_loads_single_turn_rows_and_skips_multi_turn() -> None:
    got = load_hf(HfPrompts(**SOURCE), "agent")  # type: ignore[arg-type]
    assert got.reports["train"].unconvertible == 1
    assert "2 turns" in got.reports["train"].reasons[0]
    ids = {p.id for p in got.train + got.eval}
    assert ids == {"simple_0", "simple_1", "simple_2", "parallel_0", "multiple_0"}
    p = next(p for p in got.train + got.eval if p.id == "simple_0")
    assert p.meta["task"] == "function_call"
    assert p.meta["tools"][0]["function"]["parameters"]["type"] == "object"  # BFCL's "dict"
    assert p.prompt.startswith("Find the area of a triangle")


def _calls(*calls: tuple[str, dict[str, Any]]) -> str:
    return FMT.render_calls([ToolCallText(name, args) for name, args in calls])


TRI = "calculate_triangle_area"
WEATHER = "get_current_weather"
# (row, completion, reason): right forms first, then each way to be wrong.
CASES: list[tuple[str, str, str]] = [
    ("simple_0", _calls((TRI, {"base": 10, "height": 5})), OK),  # optional unit left out
    ("simple_0", _calls((TRI, {"base": 10, "height": 5, "unit": "units"})), OK),
    ("simple_0", _calls((TRI, {"height": 5, "base": 10, "unit": "Units"})), OK),  # order, case
    (
        "simple_0",
        "<think>Area needs base and height.</think>\n" + _calls((TRI, {"base": 10, "height": 5})),
        OK,
    ),
    ("simple_1", _calls(("calculate_density", {"mass": 45, "volume": 15})), OK),  # int for float
    ("simple_1", _calls(("calculate_density", {"mass": 45.0, "volume": 15.0})), OK),
    ("simple_2", _calls(("sort_list", {"elements": [3, 1, 2], "order": "desc"})), OK),
    (
        "parallel_0",
        _calls((WEATHER, {"location": "Paris"}), (WEATHER, {"location": "Boston, Massachusetts"})),
        OK,
    ),  # any order, either accepted city
    (
        "multiple_0",
        _calls(
            (
                "book_hotel",
                {"hotel": "the grand", "nights": 2, "guest": {"name": "Ann", "adults": 2}, "breakfast": True},
            )
        ),
        OK,
    ),  # fmt: skip
    ("simple_0", _calls((TRI, {"base": 10.0, "height": 5})), WRONG_ANSWER),  # float for integer
    ("simple_0", _calls((TRI, {"base": "10", "height": 5})), WRONG_ANSWER),  # string for integer
    ("simple_0", _calls((TRI, {"base": True, "height": 5})), WRONG_ANSWER),  # bool for integer
    ("simple_0", _calls((TRI, {"base": 10})), WRONG_ANSWER),  # required height missing
    ("simple_0", _calls((TRI, {"base": 10, "height": 5, "color": "red"})), WRONG_ANSWER),  # extra
    ("simple_0", _calls((TRI, {"base": 5, "height": 10})), WRONG_ANSWER),  # swapped values
    ("simple_0", _calls((TRI, {"base": 10, "height": 5, "unit": "cm"})), WRONG_ANSWER),
    ("simple_0", _calls(("triangle_area", {"base": 10, "height": 5})), WRONG_ANSWER),  # name
    ("simple_0", _calls((TRI, {"base": 10, "height": 5}), (TRI, {"base": 10, "height": 5})), WRONG_ANSWER),
    ("simple_1", _calls(("calculate_density", {"mass": "45", "volume": 15})), WRONG_ANSWER),
    ("simple_2", _calls(("sort_list", {"elements": [1, 2, 3], "order": "desc"})), WRONG_ANSWER),  # sorted
    ("simple_2", _calls(("sort_list", {"elements": [3, 1], "order": "desc"})), WRONG_ANSWER),
    ("simple_2", _calls(("sort_list", {"elements": [3.0, 1, 2], "order": "desc"})), WRONG_ANSWER),
    ("simple_2", _calls(("sort_list", {"elements": [3, 1, 2]})), WRONG_ANSWER),  # order not optional
    ("parallel_0", _calls((WEATHER, {"location": "Paris"})), WRONG_ANSWER),  # one of two
    ("parallel_0", _calls((WEATHER, {"location": "Paris"}), (WEATHER, {"location": "Paris"})), WRONG_ANSWER),
    (
        "parallel_0",
        _calls((WEATHER, {"location": "Boston, MA", "unit": "celsius"}), (WEATHER, {"location": "Paris"})),
        WRONG_ANSWER,
    ),
    (
        "multiple_0",
        _calls(
            (
                "book_hotel",
                {"hotel": "Grand", "nights": 2, "guest": {"name": "Ann", "adults": 3}, "breakfast": True},
            )
        ),
        WRONG_ANSWER,
    ),  # fmt: skip
    (
        "multiple_0",
        _calls(
            (
                "book_hotel",
                {
                    "hotel": "Grand",
                    "nights": 2,
                    "guest": {"name": "Ann", "adults": 2, "pet": 1},
                    "breakfast": True,
                },
            )
        ),
        WRONG_ANSWER,
    ),  # fmt: skip
    ("simple_0", "The area is 25.", NO_ANSWER),
    ("simple_0", f"<think>{_calls((TRI, {'base': 10, 'height': 5}))}</think>\n25", NO_ANSWER),
    ("simple_0", "<tool_call>\n{calculate_triangle_area(base=10, height=5)}\n</tool_call>", PARSE_ERROR),
    ("simple_0", _calls((TRI, {"base": 10, "height": 5})) + "<tool_call>\n{", PARSE_ERROR),
]


@pytest.mark.parametrize(("row", "completion", "reason"), CASES)
def test_fixture_rows(rows: dict[str, Problem], row: str, completion: str, reason: str) -> None:
    verdict = AgentDomain().score_batch([rows[row]], [completion])[0]
    assert (verdict.reason, verdict.reward) == (reason, 1.0 if reason == OK else 0.0), verdict.detail


def test_reference_answers_match(rows: dict[str, Problem]) -> None:
    problems = list(rows.values())
    verdicts = AgentDomain().score_batch(problems, [p.answer for p in problems])
    assert [v.reason for v in verdicts] == [OK] * len(problems)


def test_values_by_type() -> None:
    assert value_accepted(3, 3.0, {"type": "number"}) and value_accepted(3.0, 3, {"type": "float"})
    assert not value_accepted(3.0, 3, {"type": "integer"})
    assert not value_accepted(True, 1, {"type": "integer"}) and not value_accepted(
        1, True, {"type": "boolean"}
    )
    assert value_accepted("San Francisco, CA", "san francisco ca", {"type": "string"})
    assert not value_accepted("San Jose", "san francisco", {"type": "string"})
    assert value_accepted([1, 2], [1, 2], {"type": "array", "items": {"type": "integer"}})
    assert not value_accepted([1, 2], [1, 2.0], None)  # no schema: the JSON types must agree
    assert value_accepted(
        {"a": [1, 2]}, {"a": [[1, 2]]}, {"type": "object", "properties": {"a": {"type": "array"}}}
    )


def test_match_call_says_why() -> None:
    expected = {"f": {"x": [1], "y": ["", 2]}}
    assert match_call(ToolCallText("f", {"x": 1}), expected, None).ok
    assert match_call(ToolCallText("f", {"x": 2}), expected, None).why == "f: argument 'x'=2 not accepted"
    assert match_call(ToolCallText("g", {"x": 1}), expected, None).why == "called 'g', expected 'f'"
    assert match_call(ToolCallText("f", {}), expected, None).why == "f: missing argument 'x'"
    assert json.dumps(expected) == '{"f": {"x": [1], "y": ["", 2]}}'  # not mutated


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"question": "q", "function": "not json", "ground_truth": "[]"}, "function is not JSON"),
        ({"question": "q", "function": "[]", "ground_truth": "[]"}, "non-empty list of function docs"),
        ({"question": "q", "function": [{"name": "f"}], "ground_truth": []}, "non-empty list of calls"),
        (
            {"question": "q", "function": [{"name": "f"}], "ground_truth": [{"f": {}, "g": {}}]},
            "each ground-truth",
        ),
        (
            {"question": "q", "function": [{"name": "f"}], "ground_truth": [{"f": {"x": 1}}]},
            "lists its accepted",
        ),
        ({"question": "q", "function": [{"description": "x"}], "ground_truth": [{"f": {}}]}, "has no name"),
        (
            {
                "question": [[{"role": "system", "content": "s"}]],
                "function": [{"name": "f"}],
                "ground_truth": [{"f": {}}],
            },
            "no user",
        ),
    ],
)
def test_bfcl_rows_that_cannot_be_problems(row: dict[str, Any], why: str) -> None:
    from cascade.domains.function_calls import RowError, bfcl_row

    with pytest.raises(RowError, match=why):
        bfcl_row(row, FMT)


def test_bfcl_row_with_plain_values() -> None:
    from cascade.domains.function_calls import bfcl_row

    prompt, answer, meta = bfcl_row(
        {"question": "Call f.", "function": [{"name": "f", "parameters": {"type": "dict", "properties": {}}}],
         "ground_truth": [{"f": {}}]},
        FMT,
    )  # fmt: skip
    assert prompt == "Call f." and answer == FMT.render_calls([ToolCallText("f", {})])
    assert meta["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    ]


def test_bfcl_question_as_json_text_of_messages() -> None:
    from cascade.domains.function_calls import bfcl_row

    messages = json.dumps([[{"role": "user", "content": "Call f now."}]])
    prompt, _, _ = bfcl_row(
        {"question": messages, "function": [{"name": "f"}], "ground_truth": [{"f": {}}]}, FMT
    )
    assert prompt == "Call f now."


# --------------------------------------------------------------------------- issue 33: the value, not
# what a normalisation makes of it

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "x": {"type": "float"},
                    "n": {"type": "integer"},
                    "s": {"type": "string"},
                    "xs": {"type": "array", "items": {"type": "number"}},
                },
            },
        },
    }
]


def _problem(expected: dict[str, list[Any]]) -> Problem:
    meta = {"task": "function_call", "tools": TOOLS, "expected_calls": [{"f": expected}]}
    return Problem("p", "agent", "Call f.", "", meta)


def _score(expected: dict[str, list[Any]], arguments_json: str) -> tuple[str, float]:
    completion = f'<tool_call>\n{{"name": "f", "arguments": {arguments_json}}}\n</tool_call>'
    verdict = AgentDomain().score_batch([_problem(expected)], [completion])[0]
    return verdict.reason, verdict.reward


@pytest.mark.parametrize(
    ("expected", "arguments"),
    [
        ({"x": [1.5]}, '{"x": 1' + "0" * 400 + "}"),  # raised OverflowError
        ({"x": [1.5]}, '{"x": -1' + "0" * 400 + "}"),
        ({"xs": [[1.5]]}, '{"xs": [1' + "0" * 400 + "]}"),
        ({"x": [1e308]}, '{"x": 1' + "0" * 400 + "}"),
        ({"x": [1.5]}, '{"x": 1e999}'),  # inf
        ({"x": [1.5]}, '{"x": NaN}'),
        ({"x": [1.5]}, '{"x": -Infinity}'),
        ({"n": [3]}, '{"n": 1' + "0" * 400 + "}"),
        ({"s": ["3"]}, '{"s": 1' + "0" * 400 + "}"),
    ],
)
def test_huge_and_non_finite_numbers_are_wrong(expected: dict[str, list[Any]], arguments: str) -> None:
    assert _score(expected, arguments) == (WRONG_ANSWER, 0.0)


def test_huge_numbers_equal_to_the_expected_one_are_paid() -> None:
    big = 10**400
    assert _score({"x": [big]}, '{"x": 1' + "0" * 400 + "}") == (OK, 1.0)
    assert _score({"n": [big]}, '{"n": 1' + "0" * 400 + "}") == (OK, 1.0)
    assert not value_accepted(big, 1e308, {"type": "number"}) and not value_accepted(1e308, big, None)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("5", "-5"),
        ("-5", "5"),
        ("1.5", "15"),
        ("15", "1.5"),
        ("2023-1-005", "2023-10-05"),
        ("20231005", "2023-10-05"),
        ("1,5", "1.5"),
        ("1 5", "15"),
        (".5", "5"),
        ("x 5", "x -5"),
        ("-0.5 degrees", "0.5 degrees"),
        ("Temperature: 5", "temperature -5"),
    ],
)
def test_strings_that_differ_in_sign_digits_or_separators_are_not_paid(given: str, expected: str) -> None:
    assert not value_accepted(given, expected, {"type": "string"})
    assert _score({"s": [expected]}, json.dumps({"s": given})) == (WRONG_ANSWER, 0.0)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("New York, NY", "new york ny"),
        ("San Francisco", "sanfrancisco"),
        ("F-16", "f16"),
        ("Room 5.", "room 5"),
        ("2023-10-05", "2023-10-05"),
        ("1, 2, 3", "1,2,3"),
        ("5 km", "5km"),
        ("-5", "-5"),
        ("snake_case_name", "Snake Case Name"),
        ("2^10", "2^10"),
        ("  padded  ", "padded"),
    ],
)
def test_strings_that_differ_in_case_spaces_or_punctuation_only_are_paid(given: str, expected: str) -> None:
    assert value_accepted(given, expected, {"type": "string"})
    assert _score({"s": [expected]}, json.dumps({"s": given})) == (OK, 1.0)


# Properties (hypothesis, derandomized: the same examples on every run).

_NUMBER_TEXT = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr).filter(lambda t: "e" not in t),
    st.lists(st.integers(0, 9999), min_size=2, max_size=4).map(lambda g: "-".join(str(x) for x in g)),
    st.dates().map(str),
)
_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéß", min_size=1, max_size=8)
_TOKENS = st.lists(st.one_of(_WORD, _NUMBER_TEXT), min_size=1, max_size=6)
_STRING = {"type": "string"}


def _is_number(token: str) -> bool:
    return token[0] in "-." or token[0].isdigit()


def _join(tokens: list[str], gaps: list[str]) -> str:
    """Tokens joined with whitespace gaps; where a gap could merge two numbers (or join a word to a
    sign), it keeps at least one space (without one the value would change)."""
    out = tokens[0]
    for gap, token in zip(gaps, tokens[1:], strict=False):
        if not gap and (_is_number(token) and (out[-1].isdigit() or token[0] in "-.")):
            gap = " "
        out += gap + token
    return out


@settings(derandomize=True, max_examples=examples(300), deadline=None)
@given(tokens=_TOKENS, data=st.data())
def test_property_case_and_whitespace_keep_the_verdict(tokens: list[str], data: st.DataObject) -> None:
    gaps = st.lists(st.text(alphabet=" \t\n", max_size=3), min_size=len(tokens), max_size=len(tokens))
    expected = _join(tokens, [" "] * len(tokens))
    given_text = _join(tokens, data.draw(gaps))
    flips = data.draw(st.lists(st.booleans(), min_size=len(given_text), max_size=len(given_text)))
    given_text = "".join(c.swapcase() if flip else c for c, flip in zip(given_text, flips, strict=True))
    pad = st.sampled_from(["", " ", "\t"])
    given_text = data.draw(pad) + given_text + data.draw(pad)
    assert value_accepted(given_text, expected, _STRING), (given_text, expected)


def _mutations(text: str) -> list[str]:
    """Each way to change a sign, a digit or a separator of the numbers in `text` (a number is
    preceded by the start or a space)."""
    out = []
    for i, c in enumerate(text):
        if c.isdigit():
            out.append(text[:i] + str((int(c) + 1) % 10) + text[i + 1 :])
            out.append(text[:i] + text[i + 1 :] if len(text) > 1 else "")  # digit dropped
            out.append(text[:i] + c + "0" + text[i + 1 :])  # digit added
            starts = i == 0 or text[i - 1] == " "
            if starts:
                out.append(text[:i] + "-" + text[i:])  # sign added
        if c == "-" and i + 1 < len(text) and text[i + 1].isdigit() and (i == 0 or text[i - 1] == " "):
            out.append(text[:i] + text[i + 1 :])  # sign dropped
        if c in "-." and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit():
            out.append(text[:i] + text[i + 1 :])  # separator dropped
            out.append(text[:i] + " " + text[i + 1 :])
            out.append(text[:i] + ("," if c == "." else "/") + text[i + 1 :])
            out.append(text[: i - 1] + c + text[i - 1] + text[i + 1 :])  # separator moved
    return [m for m in out if m != text]


@settings(derandomize=True, max_examples=examples(300), deadline=None)
@given(tokens=_TOKENS.filter(lambda ts: any(_is_number(t) for t in ts)), data=st.data())
def test_property_a_sign_digit_or_separator_changes_it(tokens: list[str], data: st.DataObject) -> None:
    text = _join(tokens, [" "] * len(tokens))
    assert value_accepted(text, text, _STRING)
    mutations = _mutations(text)
    for wrong in data.draw(st.lists(st.sampled_from(mutations), min_size=1, max_size=8)) if mutations else []:
        assert not value_accepted(wrong, text, _STRING), (wrong, text)
        assert not value_accepted(text, wrong, _STRING), (text, wrong)


_ANY_NUMBER = st.one_of(
    st.integers(min_value=-(10**1000), max_value=10**1000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([10**400, -(10**400), float("nan"), float("inf"), -float("inf"), 1e308]),
)
_KINDS = [None, "integer", "number", "float", "string", "boolean", "array", "object"]


@settings(derandomize=True, max_examples=examples(300), deadline=None)
@given(value=_ANY_NUMBER, accepted=_ANY_NUMBER, kind=st.sampled_from(_KINDS))
def test_property_numbers_never_raise(value: Any, accepted: Any, kind: str | None) -> None:
    schema = {"type": kind} if kind else None
    for v, a in ((value, accepted), ([value], [accepted]), ({"k": value}, {"k": [accepted]})):
        assert isinstance(value_accepted(v, a, schema), bool)
    call = ToolCallText("f", {"x": value, "n": value, "xs": [value]})
    result = match_call(call, {"f": {"x": [accepted], "n": [accepted], "xs": [[accepted]]}}, TOOLS[0])
    assert isinstance(result.ok, bool)
    if isinstance(value, float) and value != value:
        assert not result.ok  # NaN equals nothing

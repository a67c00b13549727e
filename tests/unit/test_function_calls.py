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

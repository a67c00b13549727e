"""Function calls matched structurally, the idea of the Berkeley Function-Calling Leaderboard's
AST check: a call matches an expected one when the function name is the same and every argument,
read as a parsed value, is one of the values accepted for that parameter.

Expected calls are BFCL's ground-truth shape: `[{"fn": {"param": [accepted, ...]}}]`. An accepted
value `""` marks an optional parameter that may be left out; any other parameter must be given.
Comparison follows the parameter's type in the function's JSON schema:
- `integer`: an int (not a bool, not a float: `3.0` is not `3`), equal;
- `number` / `float`: an int or a float, equal as numbers (`3` is accepted for `3.0`), compared
  exactly (an int too large for a float is simply not equal; NaN equals nothing);
- `string`: a string, equal after case-folding and dropping spaces and `,./-_*^` where they do
  not change the value (so `"New York, NY"` matches `"new york ny"`, `"F-16"` matches `"f16"`).
  BFCL drops those characters everywhere; here they stay where they are part of a number (see
  `canonical_string`): between two digits (`"1.5"` is not `"15"`, `"2023-10-05"` not
  `"2023-1-005"`; a run of spaces there is one space: `"1 5"` is not `"15"`), and a `-` or `.`
  right before a number that does not join it to a word (`"-5"` is not `"5"`, `"x -5"` not `"x 5"`,
  `".5"` not `"5"`; but `"F-16"` is `"F16"`);
- `boolean`: a bool, equal;
- `array` / `tuple`: a list of the same length, each item compared by `items`' type;
- `object` / `dict`: a dict with the same keys, each value compared by the property's type
  (in an accepted dict each key lists its accepted values, as at the top level: BFCL's form);
- no schema or another type: the same JSON type and equal.
A call with an argument the expected call does not list, a missing required argument or a
different function name does not match. Several expected calls (BFCL's parallel and multiple
categories) must each match one call, in any order, and there must be no extra call.

`bfcl_row` converts one row of BFCL's schema (question, function docs as JSON schemas, ground
truth) into an agent problem; it is the `bfcl` adapter of `kind: hf` sources.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cascade.tools.template import ToolCallText, ToolFormat

OPTIONAL = ""
_NOISE_RUN = re.compile(r"[\s,./\-_*^]+")
_SIGN_OR_POINT = re.compile(r"[-.]+$")


@dataclass(frozen=True)
class MatchResult:
    ok: bool
    why: str = ""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def value_accepted(value: Any, accepted: Any, schema: Mapping[str, Any] | None) -> bool:
    """`value` (a parsed argument) is `accepted` under the parameter's schema."""
    kind = (schema or {}).get("type")
    if kind == "integer":
        return type(value) is int and _number(accepted) and value == accepted
    if kind in ("number", "float"):
        # int == float in Python compares exact values (no conversion that could overflow)
        return _number(value) and _number(accepted) and bool(value == accepted)
    if kind == "string":
        return (
            isinstance(value, str)
            and isinstance(accepted, str)
            and canonical_string(value) == canonical_string(accepted)
        )
    if kind == "boolean":
        return type(value) is bool and value is accepted
    if kind in ("array", "tuple"):
        if (
            not isinstance(value, list)
            or not isinstance(accepted, list | tuple)
            or len(value) != len(accepted)
        ):
            return False
        items = (schema or {}).get("items")
        return all(value_accepted(v, a, items) for v, a in zip(value, accepted, strict=True))
    if kind in ("object", "dict"):
        if not isinstance(value, dict) or not isinstance(accepted, dict):
            return False
        properties = (schema or {}).get("properties", {})
        return _dict_accepted(value, accepted, properties)
    return _same_json(value, accepted)


def canonical_string(text: str) -> str:
    """`text` case-folded, with BFCL's noise (spaces and `,./-_*^`) dropped where it does not
    change the value; two strings match when their canonical forms are equal. A run of noise
    - between two digits is a separator: kept without its spaces (a run of spaces only: one space);
    - right before a digit (and not after one) keeps its trailing `-`/`.` (a sign or a decimal
      point), unless the run is a single `-` or `.` right after a letter (`F-16`, `v.2`);
    - anywhere else is dropped."""
    out: list[str] = []
    at = 0
    for run in _NOISE_RUN.finditer(text):
        out.append(text[at : run.start()])
        at = run.end()
        before = text[run.start() - 1] if run.start() else ""
        after = text[run.end()] if run.end() < len(text) else ""
        noise = run.group()
        if not after.isdigit():
            continue
        if before.isdigit():
            kept = "".join(noise.split())
            out.append(kept or " ")
        elif not (before.isalpha() and noise in ("-", ".")):
            sign = _SIGN_OR_POINT.search(noise)
            if sign:
                out.append(sign.group())
    out.append(text[at:])
    return "".join(out).casefold().replace("'", '"')


def _same_json(value: Any, accepted: Any) -> bool:
    """Equal with the same JSON types all the way down (`1` is not `1.0`, nor `true`)."""
    if type(value) is not type(accepted):
        return False
    if isinstance(value, list):
        return len(value) == len(accepted) and all(
            _same_json(v, a) for v, a in zip(value, accepted, strict=True)
        )
    if isinstance(value, dict):
        return value.keys() == accepted.keys() and all(_same_json(value[k], accepted[k]) for k in value)
    return bool(value == accepted)


def _dict_accepted(
    value: Mapping[str, Any], accepted: Mapping[str, Any], properties: Mapping[str, Any]
) -> bool:
    for key, options in accepted.items():
        alternatives = options if isinstance(options, list) else [options]
        if key not in value:
            if OPTIONAL in alternatives:
                continue
            return False
        if not any(value_accepted(value[key], a, properties.get(key)) for a in alternatives if a != OPTIONAL):
            return False
    return set(value) <= set(accepted)


def match_call(
    call: ToolCallText, expected: Mapping[str, Mapping[str, Sequence[Any]]], schema: Mapping[str, Any] | None
) -> MatchResult:
    """`call` against one expected call `{"fn": {"param": [accepted, ...]}}`; `schema` is the
    function's doc (`{"name", "parameters": {...}}`, or the `tools=` form with `function`)."""
    if len(expected) != 1:
        return MatchResult(False, f"an expected call names one function, got {sorted(expected)}")
    ((name, params),) = expected.items()
    if call.name != name:
        return MatchResult(False, f"called {call.name!r}, expected {name!r}")
    properties = _parameters(schema).get("properties", {})
    extra = sorted(set(call.arguments) - set(params))
    if extra:
        return MatchResult(False, f"{name}: unexpected argument(s) {extra}")
    for param, accepted in params.items():
        if param not in call.arguments:
            if OPTIONAL in accepted:
                continue
            return MatchResult(False, f"{name}: missing argument {param!r}")
        value = call.arguments[param]
        if not any(value_accepted(value, a, properties.get(param)) for a in accepted if not _is_optional(a)):
            return MatchResult(False, f"{name}: argument {param!r}={_shown(value)} not accepted")
    return MatchResult(True)


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)[:60]
    except (ValueError, TypeError, RecursionError):
        return f"<{type(value).__name__}>"


def _is_optional(accepted: Any) -> bool:
    return isinstance(accepted, str) and accepted == OPTIONAL


def _parameters(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not schema:
        return {}
    doc = schema.get("function", schema)
    params = doc.get("parameters", {})
    return params if isinstance(params, Mapping) else {}


def match_calls(
    calls: Sequence[ToolCallText],
    expected: Sequence[Mapping[str, Mapping[str, Sequence[Any]]]],
    schemas: Sequence[Mapping[str, Any]],
) -> MatchResult:
    """Every expected call matched by a distinct call, in any order, and no call left over."""
    if len(calls) != len(expected):
        return MatchResult(False, f"{len(calls)} call(s), expected {len(expected)}")
    by_name = {_name(s): s for s in schemas}
    results = [
        [match_call(call, want, by_name.get(next(iter(want), ""))) for want in expected] for call in calls
    ]
    if _perfect_matching(results, 0, set()):
        return MatchResult(True)
    first = next((r for row in results for r in row if not r.ok), MatchResult(False, "no matching"))
    return MatchResult(False, first.why)


def _name(schema: Mapping[str, Any]) -> str:
    return str(schema.get("function", schema).get("name", ""))


def _perfect_matching(results: list[list[MatchResult]], i: int, used: set[int]) -> bool:
    if i == len(results):
        return True
    for j, result in enumerate(results[i]):
        if j not in used and result.ok and _perfect_matching(results, i + 1, used | {j}):
            return True
    return False


# --------------------------------------------------------------------------- BFCL rows


class RowError(ValueError):
    """The row cannot be a function-call problem (the adapter turns it into `Unconvertible`)."""


def _json_field(row: Mapping[str, Any], column: str) -> Any:
    value = row[column]
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise RowError(f"{column} is not JSON") from None
    return value


def _user_text(question: Any) -> str:
    if isinstance(question, str):
        return question
    turns = question
    if isinstance(turns, list) and turns and all(isinstance(t, list) for t in turns):
        if len(turns) != 1:
            raise RowError(f"{len(turns)} turns (only single-turn rows)")
        turns = turns[0]
    if not isinstance(turns, list):
        raise RowError("question is neither text nor a list of messages")
    users = [str(m.get("content", "")) for m in turns if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise RowError("question has no user message")
    return "\n".join(users)


def tool_schema(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as a `tools=` entry (BFCL writes `dict` for the JSON-schema `object`)."""
    if "name" not in doc:
        raise RowError("a function doc has no name")
    doc = dict(doc.get("function", doc))
    params = dict(doc.get("parameters") or {"type": "object", "properties": {}})
    if params.get("type") == "dict":
        params["type"] = "object"
    doc["parameters"] = params
    return {"type": "function", "function": doc}


def reference_calls(
    expected: Sequence[Mapping[str, Mapping[str, Sequence[Any]]]], schemas: Sequence[Mapping[str, Any]] = ()
) -> list[ToolCallText]:
    """The first accepted value of each parameter (optional ones left out when `""` comes first;
    in an accepted dict, each key's first alternative)."""
    by_name = {_name(s): _parameters(s).get("properties", {}) for s in schemas}
    calls = []
    for want in expected:
        ((name, params),) = want.items()
        properties = by_name.get(name, {})
        arguments = {
            p: _first(values[0], properties.get(p))
            for p, values in params.items()
            if values and not _is_optional(values[0])
        }
        calls.append(ToolCallText(name, arguments))
    return calls


def _first(accepted: Any, schema: Mapping[str, Any] | None) -> Any:
    if not isinstance(accepted, dict):
        return accepted
    properties = (schema or {}).get("properties", {})
    out = {}
    for key, options in accepted.items():
        if isinstance(options, list):
            if options and not _is_optional(options[0]):
                out[key] = _first(options[0], properties.get(key))
        else:
            out[key] = options
    return out


def bfcl_row(row: Mapping[str, Any], fmt: ToolFormat) -> tuple[str, str, dict[str, Any]]:
    """(prompt, reference answer, meta) of one row: `question`, `function` (docs), `ground_truth`."""
    docs = _json_field(row, "function")
    expected = _json_field(row, "ground_truth")
    if not isinstance(docs, list) or not docs or not all(isinstance(d, Mapping) for d in docs):
        raise RowError("function must be a non-empty list of function docs")
    if not isinstance(expected, list) or not expected:
        raise RowError("ground_truth must be a non-empty list of calls")
    for want in expected:
        if not isinstance(want, Mapping) or len(want) != 1:
            raise RowError("each ground-truth call is {function: {param: [accepted, ...]}}")
        params = next(iter(want.values()))
        if not isinstance(params, Mapping) or not all(isinstance(v, list) for v in params.values()):
            raise RowError("each ground-truth parameter lists its accepted values")
    tools = [tool_schema(d) for d in docs]
    answer = fmt.render_calls(reference_calls(expected, tools))
    meta = {"task": "function_call", "tools": tools, "expected_calls": expected}
    return _user_text(_question(row["question"])), answer, meta


def _question(value: Any) -> Any:
    """The messages (a list, or JSON text of one), or the question itself as plain text."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value

"""The tool environment of one episode: reads a model turn's calls, runs them, answers each.

`ToolEnvironment.step(turn_text)` never raises for anything the model wrote. Every call attempt
gets exactly one response, in order: the tool's output, or `error: <why>` for a call that
failed (`tool_error`: a missing key, a division by zero, a crashing program) or was malformed.
Malformed classes (counted in `EpisodeStats.malformed`): `bad_json` (not a JSON object with a
string name and an object of arguments, or a call left unclosed), `unknown_tool`,
`bad_arguments` (missing, extra or wrongly typed against the tool's schema), `oversized` (the
call's text over `max_call_chars`; it is not parsed), `too_many_calls_turn`,
`too_many_calls_episode` (calls past the limits are answered with the error, not run).

A tool that cannot run at all (`ToolUnavailable`: the sandbox is missing or failed) raises: that
is the infrastructure's failure, not a response the model earned.

A turn with no call attempt is the episode's final answer. Calls inside the reasoning block
(`<think>...</think>`) are not calls. The state is a `KeyValueStore` built from the problem's
initial values, so an episode replays exactly from the same problem and the same turns.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cascade.model.chat import strip_thinking
from cascade.tools.builtin import Calc, KeyValueStore, KvGet, KvList, KvSet, PythonTool, Tool, ToolError
from cascade.tools.template import ToolCallText, ToolFormat

BAD_JSON = "bad_json"
UNKNOWN_TOOL = "unknown_tool"
BAD_ARGUMENTS = "bad_arguments"
OVERSIZED = "oversized"
TOO_MANY_TURN = "too_many_calls_turn"
TOO_MANY_EPISODE = "too_many_calls_episode"
MALFORMED_KINDS = (BAD_JSON, UNKNOWN_TOOL, BAD_ARGUMENTS, OVERSIZED, TOO_MANY_TURN, TOO_MANY_EPISODE)
ERROR_PREFIX = "error: "


@dataclass(frozen=True)
class ToolLimits:
    max_calls_per_turn: int = 4
    max_calls_per_episode: int = 12
    max_call_chars: int = 512
    """A call's text between its markers; longer is `oversized` and never parsed."""
    max_response_chars: int = 256
    """A tool response is cut to this (a python program's output, a long key list)."""


@dataclass
class EpisodeStats:
    """Counts for one episode, for the metrics (`as_metrics`)."""

    turns: int = 0
    calls: int = 0
    """Well-formed calls that ran."""
    ok: int = 0
    tool_errors: int = 0
    malformed: Counter[str] = field(default_factory=Counter)

    def as_metrics(self) -> dict[str, float]:
        out = {"turns": float(self.turns), "calls": float(self.calls), "calls_ok": float(self.ok)}
        out["tool_errors"] = float(self.tool_errors)
        out["malformed_calls"] = float(sum(self.malformed.values()))
        out |= {f"malformed_{kind}": float(self.malformed[kind]) for kind in MALFORMED_KINDS}
        return out


def episode_metrics(episodes: Sequence[EpisodeStats]) -> dict[str, float]:
    """Per-batch metrics: means per episode of every count, and the share of call attempts
    that were malformed or failed (0 when there was no attempt)."""
    if not episodes:
        return {}
    totals: Counter[str] = Counter()
    for stats in episodes:
        totals.update(stats.as_metrics())
    out = {f"{name}_per_episode": value / len(episodes) for name, value in sorted(totals.items())}
    attempts = totals["calls"] + totals["malformed_calls"]
    out["malformed_call_rate"] = totals["malformed_calls"] / attempts if attempts else 0.0
    out["tool_error_rate"] = totals["tool_errors"] / attempts if attempts else 0.0
    return out


@dataclass(frozen=True)
class CallOutcome:
    """One call attempt and its response. `call` is None when it could not be read."""

    call: ToolCallText | None
    response: str
    error: str | None = None
    """None: it ran and succeeded; `tool_error` or a malformed kind otherwise."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class StepResult:
    outcomes: tuple[CallOutcome, ...]

    @property
    def final(self) -> bool:
        """The turn made no call attempt: it is the final answer."""
        return not self.outcomes

    @property
    def responses(self) -> list[str]:
        return [o.response for o in self.outcomes]


def call_spans(text: str, fmt: ToolFormat) -> list[tuple[int, int, str | None]]:
    """(start, end, body) of each call attempt in `text`; body None for a call left unclosed."""
    spans: list[tuple[int, int, str | None]] = []
    at = 0
    while (start := text.find(fmt.call_open, at)) >= 0:
        body_start = start + len(fmt.call_open)
        end = text.find(fmt.call_close, body_start)
        if end < 0:
            spans.append((start, len(text), None))
            break
        spans.append((start, end + len(fmt.call_close), text[body_start:end]))
        at = end + len(fmt.call_close)
    return spans


def read_call(body: str | None, fmt: ToolFormat, max_chars: int) -> ToolCallText | tuple[str, str]:
    """The call in a body, or (malformed kind, why)."""
    if body is None:
        return BAD_JSON, f"{fmt.call_open} without {fmt.call_close}"
    if len(body) > max_chars:
        return OVERSIZED, f"call longer than {max_chars} characters"
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return BAD_JSON, "the call is not valid JSON"
    if not isinstance(value, dict):
        return BAD_JSON, "the call is not a JSON object"
    name, arguments = value.get(fmt.name_key), value.get(fmt.arguments_key, {})
    if not isinstance(name, str):
        return BAD_JSON, f"the call has no string {fmt.name_key!r}"
    if not isinstance(arguments, dict) or set(value) - {fmt.name_key, fmt.arguments_key}:
        return BAD_JSON, f"the call needs {fmt.name_key!r} and an object {fmt.arguments_key!r} only"
    return ToolCallText(name, arguments)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def schema_errors(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """Why `arguments` do not fit a function schema's parameters (top-level types), or None."""
    parameters = schema["function"]["parameters"]
    properties: Mapping[str, Any] = parameters.get("properties", {})
    missing = [p for p in parameters.get("required", []) if p not in arguments]
    if missing:
        return f"missing argument(s) {missing}"
    extra = sorted(set(arguments) - set(properties))
    if extra:
        return f"unknown argument(s) {extra}"
    for key, value in arguments.items():
        kind = properties[key].get("type")
        types = _JSON_TYPES.get(kind, (object,))
        if not isinstance(value, types) or (isinstance(value, bool) and kind != "boolean"):
            return f"argument {key!r} must be {kind}, got {type(value).__name__}"
    return None


class ToolEnvironment:
    """One episode's tools over a fresh store (see the module docstring)."""

    def __init__(
        self,
        fmt: ToolFormat,
        store: Mapping[str, int],
        *,
        tools: Sequence[str] = ("kv_get", "kv_set", "kv_list", "calc"),
        limits: ToolLimits | None = None,
        python: PythonTool | None = None,
    ) -> None:
        self.fmt = fmt
        self.limits = limits or ToolLimits()
        self.store = KeyValueStore(store)
        available: dict[str, Tool] = {
            t.name: t for t in (KvGet(self.store), KvSet(self.store), KvList(self.store), Calc())
        }
        if python is not None:
            available[python.name] = python
        unknown = [name for name in tools if name not in available]
        if unknown:
            raise ValueError(f"tools: unknown or unavailable tool(s) {unknown}")
        self.tools: dict[str, Tool] = {name: available[name] for name in tools}
        self.stats = EpisodeStats()

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    def step(self, turn_text: str) -> StepResult:
        self.stats.turns += 1
        outcomes = []
        for n, (_, _, body) in enumerate(call_spans(strip_thinking(turn_text), self.fmt)):
            outcomes.append(self._attempt(n, body))
        return StepResult(tuple(outcomes))

    def _attempt(self, index_in_turn: int, body: str | None) -> CallOutcome:
        read = read_call(body, self.fmt, self.limits.max_call_chars)
        call = read if isinstance(read, ToolCallText) else None
        if index_in_turn >= self.limits.max_calls_per_turn:
            return self._malformed(
                call, TOO_MANY_TURN, f"at most {self.limits.max_calls_per_turn} calls a turn"
            )
        if self.stats.calls + sum(self.stats.malformed.values()) >= self.limits.max_calls_per_episode:
            return self._malformed(
                call, TOO_MANY_EPISODE, f"at most {self.limits.max_calls_per_episode} calls an episode"
            )
        if call is None:
            kind, why = read if isinstance(read, tuple) else (BAD_JSON, "")
            return self._malformed(None, kind, why)
        tool = self.tools.get(call.name)
        if tool is None:
            return self._malformed(
                call, UNKNOWN_TOOL, f"unknown tool {call.name[:40]!r}; tools: {', '.join(self.tools)}"
            )
        problem = schema_errors(call.arguments, tool.schema)
        if problem is not None:
            return self._malformed(call, BAD_ARGUMENTS, problem)
        self.stats.calls += 1
        try:
            response = tool.run(call.arguments)
        except ToolError as err:
            self.stats.tool_errors += 1
            return CallOutcome(call, self._cut(ERROR_PREFIX + str(err)), "tool_error")
        self.stats.ok += 1
        return CallOutcome(call, self._cut(response))

    def _malformed(self, call: ToolCallText | None, kind: str, why: str) -> CallOutcome:
        self.stats.malformed[kind] += 1
        return CallOutcome(call, self._cut(f"{ERROR_PREFIX}{kind}: {why}"), kind)

    def _cut(self, text: str) -> str:
        limit = self.limits.max_response_chars
        return text if len(text) <= limit else text[: limit - 3] + "..."

"""The tools of the agent environment: a key-value store, a calculator, and sandboxed Python.

Each tool has a JSON schema (what a chat template renders under `tools=`; arguments are checked
against it before the tool runs) and `run(arguments) -> str`. A failure the model caused (a
missing key, a division by zero, a program that crashes) raises `ToolError`, whose message goes
back to the model as the tool's response.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cascade.sandbox.jobs import (
    INFRA_ERROR,
    OK,
    WRONG_ANSWER,
    BwrapSettings,
    Job,
    SandboxLimits,
    run_jobs,
)
from cascade.sandbox.pool import SandboxUnavailable
from cascade.tools.calculator import CalcError, calculate

MAX_KEY_CHARS = 32
MAX_KEYS = 64
MAX_VALUE = 10**12


class ToolError(Exception):
    """The call was well formed but failed; the message is the tool's response."""


class ToolUnavailable(RuntimeError):
    """The tool itself could not run (the sandbox failed or is missing): not the model's doing,
    so never a response; the episode is an infrastructure failure (a verdict `infra_error`)."""


class Tool(Protocol):
    name: str

    @property
    def schema(self) -> dict[str, Any]:
        """`{"type": "function", "function": {name, description, parameters}}`."""
        ...

    def run(self, arguments: Mapping[str, Any]) -> str: ...


def function_schema(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": sorted(properties)},
        },
    }


class KeyValueStore:
    """The environment's state: string keys, integer values (what the checker reads at the end)."""

    def __init__(self, initial: Mapping[str, int]) -> None:
        self.values: dict[str, int] = dict(initial)

    def get(self, key: str) -> int:
        if key not in self.values:
            raise ToolError(f"no key {key[:MAX_KEY_CHARS]!r}")
        return self.values[key]

    def set(self, key: str, value: int) -> None:
        if not key or len(key) > MAX_KEY_CHARS or not key.replace("_", "").isalnum():
            raise ToolError(f"a key is 1-{MAX_KEY_CHARS} letters, digits or '_'")
        if abs(value) > MAX_VALUE:
            raise ToolError(f"value out of range (|value| <= {MAX_VALUE})")
        if key not in self.values and len(self.values) >= MAX_KEYS:
            raise ToolError(f"the store is full ({MAX_KEYS} keys)")
        self.values[key] = value


@dataclass
class KvGet:
    store: KeyValueStore
    name: str = "kv_get"

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(self.name, "Read a key's value.", {"key": {"type": "string"}})

    def run(self, arguments: Mapping[str, Any]) -> str:
        return str(self.store.get(arguments["key"]))


@dataclass
class KvSet:
    store: KeyValueStore
    name: str = "kv_set"

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(
            self.name, "Set a key to an integer.", {"key": {"type": "string"}, "value": {"type": "integer"}}
        )

    def run(self, arguments: Mapping[str, Any]) -> str:
        self.store.set(arguments["key"], arguments["value"])
        return "ok"


@dataclass
class KvList:
    store: KeyValueStore
    name: str = "kv_list"

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(self.name, "List the keys.", {})

    def run(self, arguments: Mapping[str, Any]) -> str:
        return " ".join(sorted(self.store.values))


@dataclass
class Calc:
    name: str = "calc"

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(
            self.name, "Exact arithmetic: + - * / // % ^ and parentheses.", {"expression": {"type": "string"}}
        )

    def run(self, arguments: Mapping[str, Any]) -> str:
        try:
            return calculate(arguments["expression"])
        except CalcError as err:
            raise ToolError(str(err)) from None


# The judge's stdout mismatch report: bwrap's judge writes `stdout <repr>`, the process harness
# `stdout = <repr>`; either way the program's output is the repr, cut at 60 characters.
_STDOUT_REPORT = re.compile(r"^test 0: stdout (?:= )?(?P<got>.*), expected ''$", re.DOTALL)
MAX_PYTHON_OUTPUT = 50
"""The sandbox reports at most ~57 characters of a program's output; longer output is cut."""


@dataclass
class PythonTool:
    """Runs the model's program in the code sandbox (as the code reward runs programs) and
    returns what it printed. The sandbox reports a program's output only when it differs from
    the expected one, as a repr cut at 60 characters: the tool asks for an empty output and
    reads the report, so at most `MAX_PYTHON_OUTPUT` characters come back (longer output ends
    in `...`)."""

    limits: SandboxLimits
    backend: Literal["auto", "bwrap", "process"] = "auto"
    settings: BwrapSettings | None = None
    name: str = "python"

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(
            self.name, "Run a Python program; returns what it prints.", {"code": {"type": "string"}}
        )

    def run(self, arguments: Mapping[str, Any]) -> str:
        job = Job(arguments["code"], [{"stdin": "", "stdout": ""}], None)
        try:
            result = run_jobs([job], self.limits, workers=1, backend=self.backend, settings=self.settings)[0]
        except SandboxUnavailable as err:
            raise ToolUnavailable(f"python: {err}") from None
        if result.status == INFRA_ERROR:
            raise ToolUnavailable(f"python: the sandbox failed: {result.detail[:200]}")
        if result.status == OK:
            return ""
        if result.status != WRONG_ANSWER:
            raise ToolError(f"{result.status}: {result.detail[:200]}")
        match = _STDOUT_REPORT.match(result.detail)
        if match is None:
            raise ToolError(f"unreadable sandbox report: {result.detail[:100]}")
        return _unrepr(match.group("got")).rstrip()


def _unrepr(text: str) -> str:
    if text.endswith("..."):
        cut = text[:-3]
        for closing in ("'", '"'):
            try:
                return str(ast.literal_eval(cut + closing))[:MAX_PYTHON_OUTPUT] + "..."
            except (ValueError, SyntaxError):
                continue
        return cut[1:MAX_PYTHON_OUTPUT] + "..."
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return str(value)

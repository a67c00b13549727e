"""Format adapters: one row of a public data set's schema -> what our verifiers consume.

Each adapter names the columns it needs (`Adapter.columns`; a missing one fails loading, naming
the column and the adapter) and converts a row to (prompt, answer, meta, id). A row it cannot
express for our verifier raises `Unconvertible` (the loader skips and counts it):

- gsm8k: `question`; `answer` ends in `#### n` -> gold `\\boxed{n}` (commas dropped); the
  worked solution in meta.
- math: `problem`; the last `\\boxed{}` of `solution` (or an `answer` column) -> gold; meta
  keeps `level`, `type`, `solution`.
- mbpp: `text` + the tests shown (as MBPP's paper prompts); `test_list` asserts of the form
  `assert f(args) == expected` (literals) -> `{"args": [...], "output": expected}` tests on
  entry point `f`; any other assert, or `test_setup_code`, makes the row unconvertible.
  `code` is the reference answer.
- humaneval: `prompt` (signature + docstring); `check(candidate)`'s `assert candidate(args) ==
  expected` lines -> the same tests on `entry_point`; `prompt + canonical_solution` is the answer.
- ifeval: `instruction_id_list` + `kwargs` -> registered rules (`hf_ifeval`); no reference
  response (answer "").
- swe: `problem_statement` (+ repository files when the row has them) -> prompt; `patch` (a
  unified diff) is the gold. A row is also runnable by the execution reward (meta `repo_files` and
  `swe_tests`, `cascade.domains.swe_exec`) when it carries the repository files (the files
  column), SWE-bench's `FAIL_TO_PASS` / `PASS_TO_PASS` test ids (lists, or JSON text of lists)
  all of the form `path.py::function` or `path.py::Class::method`, and optionally `test_patch`
  (applied to the files to add the tests); the test files must then be among the files, and the
  gold patch must apply without touching them. What runs is the stdlib only (no pytest, no
  fixtures, no parametrised ids, no installed packages), so only self-contained rows qualify;
  SWE-bench rows themselves (no file contents, Django-style ids, third-party dependencies) are
  not runnable here and keep the execution-free reward. The gold is not run at load time:
  a row whose gold fails its own tests scores 0 for every patch.
- bfcl: the Berkeley Function-Calling Leaderboard's rows (`question`, `function` docs as JSON
  schemas, `ground_truth` calls with accepted values per parameter; JSON text or values) ->
  agent problems scored by matching calls (`cascade.domains.function_calls`); multi-turn rows
  are unconvertible.
- generic: the configured `fields` mapping.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cascade.config.hf import HfPrompts


class Unconvertible(ValueError):
    """This row cannot be expressed for our verifier (the loader skips and counts it)."""


@dataclass(frozen=True)
class Converted:
    prompt: str
    answer: str
    meta: dict[str, Any]
    id: str | None = None


Row = Mapping[str, Any]


@dataclass(frozen=True)
class Adapter:
    columns: tuple[str, ...]
    """Columns every row must have."""
    convert: Callable[[Row, HfPrompts], Converted]


# --------------------------------------------------------------------------- math


_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def _gsm8k(row: Row, source: HfPrompts) -> Converted:
    match = _GSM8K_FINAL.search(str(row["answer"]))
    if not match:
        raise Unconvertible("answer has no '#### <n>' line")
    gold = match.group(1).replace(",", "").strip()
    if not gold:
        raise Unconvertible("empty answer after '####'")
    return Converted(
        str(row["question"]), f"\\boxed{{{gold}}}", {"solution": str(row["answer"]), "gold": gold}
    )


def last_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` (or `\\fbox{...}`), braces matched; None when absent."""
    found: str | None = None
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found = text[start:i]
                break
    return found.strip() if found is not None else None


def _math(row: Row, source: HfPrompts) -> Converted:
    solution = str(row["solution"])
    gold = row.get("answer")
    gold = str(gold).strip() if gold not in (None, "") else last_boxed(solution)
    if not gold:
        raise Unconvertible("solution has no \\boxed{} answer")
    meta = {"solution": solution, "gold": gold}
    meta |= {key: row[key] for key in ("level", "type", "subject") if row.get(key) is not None}
    return Converted(str(row["problem"]), f"\\boxed{{{gold}}}", meta, _optional_id(row, "unique_id"))


# --------------------------------------------------------------------------- code


def _literal(node: ast.expr, what: str) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Unconvertible(f"{what} is not a literal: {ast.unparse(node)[:80]}") from None
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        raise Unconvertible(f"{what} is not JSON-representable: {ast.unparse(node)[:80]}") from None


def assert_to_test(statement: ast.stmt, callee: str | None) -> tuple[str, dict[str, Any]]:
    """(function name, `{"args": [...], "output": y}`) from `assert f(args) == y`; `callee`
    fixes the called name (humaneval's `candidate`). Raises `Unconvertible` for other forms."""
    shown = ast.unparse(statement)[:100]
    if not isinstance(statement, ast.Assert):
        raise Unconvertible(f"not an assert: {shown}")
    test = statement.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.left, ast.Call)
        and isinstance(test.left.func, ast.Name)
        and not test.left.keywords
        and not any(isinstance(a, ast.Starred) for a in test.left.args)
    ):
        raise Unconvertible(f"not of the form `assert f(args) == expected`: {shown}")
    name = test.left.func.id
    if callee is not None and name != callee:
        raise Unconvertible(f"calls {name!r}, not {callee!r}: {shown}")
    args = [_literal(arg, "an argument") for arg in test.left.args]
    return name, {"args": args, "output": _literal(test.comparators[0], "the expected value")}


def _parse(code: str, what: str) -> list[ast.stmt]:
    try:
        return ast.parse(code).body
    except SyntaxError as err:
        raise Unconvertible(f"{what} does not parse: {err.msg} (line {err.lineno})") from None


def _mbpp(row: Row, source: HfPrompts) -> Converted:
    if str(row.get("test_setup_code") or "").strip():
        raise Unconvertible("needs test_setup_code")
    asserts = [str(a) for a in row["test_list"]]
    if not asserts:
        raise Unconvertible("empty test_list")
    names, tests = set(), []
    for line in asserts:
        for statement in _parse(line, "test"):
            name, test = assert_to_test(statement, None)
            names.add(name)
            tests.append(test)
    if len(names) != 1:
        raise Unconvertible(f"tests call several functions {sorted(names)}")
    prompt = f"{row['text']}\nYour code should pass these tests:\n\n" + "\n".join(asserts)
    entry = names.pop()
    meta = {"tests": tests, "entry_point": entry}
    return Converted(prompt, str(row.get("code") or ""), meta, _optional_id(row, "task_id", "mbpp-"))


def _humaneval(row: Row, source: HfPrompts) -> Converted:
    entry = str(row["entry_point"])
    tests = []
    check = [
        s for s in _parse(str(row["test"]), "test") if isinstance(s, ast.FunctionDef) and s.name == "check"
    ]
    if not check:
        raise Unconvertible("test defines no check(candidate)")
    param = check[0].args.args[0].arg if check[0].args.args else "candidate"
    for statement in check[0].body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring or a bare string
        if isinstance(statement, ast.Assert) and isinstance(statement.test, ast.Constant):
            continue  # `assert True`, HumanEval's filler
        tests.append(assert_to_test(statement, param)[1])
    if not tests:
        raise Unconvertible("check(candidate) has no tests")
    prompt = f"Complete this Python function:\n```python\n{row['prompt']}```"
    answer = str(row["prompt"]) + str(row.get("canonical_solution") or "")
    return Converted(prompt, answer, {"tests": tests, "entry_point": entry}, _optional_id(row, "task_id"))


# --------------------------------------------------------------------------- swe


def _files(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, Mapping):
        return [(str(k), str(v)) for k, v in value.items() if v is not None]
    if isinstance(value, list):
        out = []
        for item in value:
            if not isinstance(item, Mapping) or "path" not in item or "content" not in item:
                raise Unconvertible("files entries must be {path, content}")
            out.append((str(item["path"]), str(item["content"])))
        return out
    raise Unconvertible(f"files must be a mapping or a list, got {type(value).__name__}")


def _swe(row: Row, source: HfPrompts) -> Converted:
    from cascade.domains.patches import PatchParseError, parse_patch

    patch = str(row["patch"])
    try:
        gold = parse_patch(patch)
    except PatchParseError as err:
        raise Unconvertible(f"patch does not parse: {err}") from None
    if gold.is_noop:
        raise Unconvertible("patch changes nothing")
    parts = [str(row["problem_statement"]).strip()]
    files = _files(row[source.files_column]) if row.get(source.files_column) is not None else []
    for path, text in files:
        parts.append(f"{path}:\n```python\n{text.rstrip()}\n```")
    parts.append(
        "Reply with a unified diff that fixes the issue (--- a/<path>, +++ b/<path>, then @@ hunks)."
    )
    meta = {key: row[key] for key in ("repo", "base_commit", "instance_id") if row.get(key) is not None}
    meta["paths"] = sorted({path for path, _ in files})
    meta.update(_swe_execution(row, files, gold))
    return Converted("\n\n".join(parts), patch, meta, _optional_id(row, "instance_id"))


_SWE_TEST_COLUMNS = ("FAIL_TO_PASS", "PASS_TO_PASS")


def _swe_execution(row: Row, files: list[tuple[str, str]], gold: Any) -> dict[str, Any]:
    """`repo_files` and `swe_tests` when the row is runnable (see the module docstring), else {}."""
    from cascade.domains.patches import PatchParseError, parse_patch
    from cascade.domains.swe_exec import PatchRejected, apply_to_repo, runnable_test_id

    ids: list[str] = []
    for column in _SWE_TEST_COLUMNS:
        value = row.get(column)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return {}
        if value is None:
            continue
        if not isinstance(value, list):
            return {}
        ids.extend(str(test_id) for test_id in value)
    if not files or not ids or not all(runnable_test_id(test_id) for test_id in ids):
        return {}
    tests = [{"test": test_id} for test_id in dict.fromkeys(ids)]
    named = frozenset(test_id.split("::", 1)[0] for test_id in ids)
    try:
        repo = dict(files)
        if row.get("test_patch"):
            repo = apply_to_repo(repo, parse_patch(str(row["test_patch"])), named, tests_too=True)
        apply_to_repo(repo, gold, named)
    except (PatchParseError, PatchRejected):
        return {}
    if not named <= set(repo):
        return {}
    return {"repo_files": repo, "swe_tests": tests}


# --------------------------------------------------------------------------- agent


def _bfcl(row: Row, source: HfPrompts) -> Converted:
    from cascade.domains.agent import default_format
    from cascade.domains.function_calls import RowError, bfcl_row

    try:
        prompt, answer, meta = bfcl_row(row, default_format())
    except RowError as err:
        raise Unconvertible(str(err)) from None
    return Converted(prompt, answer, meta, _optional_id(row, "id"))


# --------------------------------------------------------------------------- if and generic


def _ifeval(row: Row, source: HfPrompts) -> Converted:
    from cascade.domains.hf_ifeval import UnusableRow, rules_for

    try:
        rules = rules_for(list(row["instruction_id_list"]), list(row["kwargs"]), source.unknown_instructions)
    except UnusableRow as err:
        raise Unconvertible(str(err)) from None
    meta = {"rules": rules, "instruction_id_list": list(row["instruction_id_list"])}
    return Converted(str(row["prompt"]), "", meta, _optional_id(row, "key", "ifeval-"))


def _generic(row: Row, source: HfPrompts) -> Converted:
    fields = source.fields
    assert fields is not None, "validated by HfPrompts"
    meta = {key: row[column] for key, column in fields.meta.items()}
    return Converted(str(row[fields.prompt]), str(row[fields.answer]), meta, _optional_id(row, fields.id))


def _optional_id(row: Row, column: str | None, prefix: str = "") -> str | None:
    value = row.get(column) if column else None
    return None if value is None else f"{prefix}{value}"


ADAPTERS: dict[str, Adapter] = {
    "gsm8k": Adapter(("question", "answer"), _gsm8k),
    "math": Adapter(("problem", "solution"), _math),
    "mbpp": Adapter(("text", "test_list"), _mbpp),
    "humaneval": Adapter(("prompt", "test", "entry_point"), _humaneval),
    "ifeval": Adapter(("prompt", "instruction_id_list", "kwargs"), _ifeval),
    "swe": Adapter(("problem_statement", "patch"), _swe),
    "bfcl": Adapter(("question", "function", "ground_truth"), _bfcl),
    "generic": Adapter((), _generic),
}


def required_columns(source: HfPrompts) -> tuple[str, ...]:
    """Columns the source's adapter (or generic mapping) reads from every row."""
    if source.adapter == "generic":
        fields = source.fields
        assert fields is not None, "validated by HfPrompts"
        return tuple(c for c in (fields.prompt, fields.answer, fields.id, *fields.meta.values()) if c)
    return ADAPTERS[source.adapter].columns

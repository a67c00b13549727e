"""Execution-based SWE reward: apply a patch to a problem's repository, run its tests in the sandbox.

A problem is runnable (`has_tests`) when its meta carries

- `repo_files`: the repository before the fix, `{path: text}` (POSIX paths relative to its root);
- `swe_tests`: the tests the fixed repository passes, each either
  `{"module": "src.util", "expr": "largest([3, 9, 2])", "output": 9}` (a value check: the
  expression evaluated in the module's namespace must equal `output`, compared by the sandbox's
  judge as a code test's return value), or `{"test": "tests/test_x.py::test_name"}` (a test
  function, or `path::Class::method`, run by the driver below: it passes when it returns
  without raising; a `unittest.TestCase` method runs through `unittest`).

Applying (`apply_to_repo`, on the host, pure Python): each file patch must name a path inside
the repository (no absolute path, no `..`, no backslash or control character) that is not a test
file (`is_test_path`: a `test`/`tests`/`testing` directory, `test_*.py`, `*_test.py`,
`conftest.py`, or a file a test names), and its hunks must match the file exactly (no fuzz,
positions searched outwards from the header's; `patches.apply_file_patch`). `/dev/null` sides
create or delete a file; differing old and new paths rename it. A refusal is a `PatchRejected`
with the reason in words.

Running (`sandbox_job`): the sandbox runs one program per patch, the driver below with the
patched files embedded. It serves the repository's modules from memory (a meta-path finder: no
file is written) and answers one check per sandbox test through its entry point. Expected values
never enter the program's process: the sandbox's judge holds them. So a patch that exits early
(`sys.exit`, `os._exit`), crashes or loops fails; one that rewrites the driver can only change
the answers it sends, which pass a value check only if they are the fixed code's values.
A test-id check answers `{"passed": true, "values": [...]}`: the values its test's top-level
literal assertions computed, whose literals were taken out of the test file before the job was
built (`swe_asserts.lift_asserts`) and which only the judge holds. A forged "passed" must carry
values only the right code computes; an always-equal object is not JSON data and fails where it
is handed over. Assertions that cannot be lifted (in loops or helpers, against a computed
expectation) run in the process the patched code shares and guard only as far as it can be
trusted. A patch may not create a module that would shadow one the tests or the driver import
from outside the repository (the standard library, installed packages) or a package a test
lives in (`tests.py` beside `tests/`): `apply_to_repo` refuses it.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import posixpath
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from cascade.domains.patches import Patch, PatchParseError, apply_file_patch
from cascade.domains.swe_asserts import RECORDER, lift_asserts
from cascade.sandbox.jobs import Job

ENTRY_POINT = "cascade_swe_check"

TEST_DIRS = frozenset({"test", "tests", "testing"})
_TEST_ID = re.compile(r"[\w./-]+\.py::\w+(?:::\w+)?")
"""Test ids the driver can run: `path.py::function` or `path.py::Class::method`."""


class PatchRejected(ValueError):
    """The patch cannot be applied to the repository, or may not be (the message says why)."""


def has_tests(meta: Mapping[str, Any]) -> bool:
    """Whether the problem carries a repository and tests to run (see the module docstring)."""
    return isinstance(meta.get("repo_files"), dict) and bool(meta.get("swe_tests"))


def runnable_test_id(test_id: str) -> bool:
    """Whether the driver can run this test id (`path.py::name` or `path.py::Class::name`)."""
    return _TEST_ID.fullmatch(test_id) is not None


def is_test_path(path: str, named: frozenset[str] = frozenset()) -> bool:
    """A file the patch may not touch: test code, pytest hooks, or a file a test names."""
    parts = path.split("/")
    name = parts[-1]
    return (
        path in named
        or any(part in TEST_DIRS for part in parts[:-1])
        or name == "conftest.py"
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
    )


def test_files(tests: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """Files the tests name (`path::...` ids)."""
    return frozenset(str(t["test"]).split("::", 1)[0] for t in tests if "test" in t)


def safe_path(path: str) -> str:
    """`path` if it names a file inside the repository, else PatchRejected."""
    if not path or path.startswith("/") or "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise PatchRejected(f"path {path[:80]!r} is not a relative path inside the repository")
    norm = posixpath.normpath(path)
    if norm != path or norm == "." or norm.startswith("../") or norm == "..":
        raise PatchRejected(f"path {path[:80]!r} is not a plain path inside the repository")
    return path


def apply_to_repo(
    repo: Mapping[str, str], patch: Patch, protected: frozenset[str], *, tests_too: bool = False
) -> dict[str, str]:
    """The repository's files after `patch` (see the module docstring); PatchRejected if refused.

    `tests_too` lets the patch edit test files (for a data set's own test patch, never a policy's).
    """
    files = dict(repo)
    test_modules = [module_of(path) for path in (*protected, *(p for p in repo if is_test_path(p)))]
    for file_patch in patch.files:
        for path in (file_patch.old_path, file_patch.new_path):
            if path is not None and is_test_path(safe_path(path), protected) and not tests_too:
                raise PatchRejected(f"the patch edits the test file {path!r}")
        old, new = file_patch.old_path, file_patch.new_path
        if old is None:
            assert new is not None  # the parser refuses /dev/null on both sides
            if new in files:
                raise PatchRejected(f"the patch creates {new!r}, which exists")
            source = ""
        elif old not in files:
            raise PatchRejected(f"the patch edits {old!r}, which is not in the repository")
        else:
            source = files[old]
        try:
            text = apply_file_patch(source, file_patch)
        except PatchParseError as err:
            raise PatchRejected(f"{file_patch.path}: {err}") from None
        if old is not None:
            del files[old]
        if new is not None and new != old and not tests_too:
            shadow = shadowed_module(new, files, test_modules)
            if shadow:
                raise PatchRejected(f"the patch creates {new!r}, which would shadow {shadow}")
        if new is not None:
            if new in files:
                raise PatchRejected(f"the patch renames onto {new!r}, which exists")
            files[new] = text
    return files


def shadowed_module(path: str, files: Mapping[str, str], test_modules: Sequence[str]) -> str:
    """What a new file at `path` would shadow, in words ("" for nothing): a module from outside the
    repository (the standard library or an installed package; the repository is first on the
    path), or a package a test module lives in."""
    top = _top_name(path)
    if not top.isidentifier():
        return ""
    if top not in {_top_name(p) for p in files if p != path}:
        if top in sys.stdlib_module_names or top in sys.builtin_module_names:
            return f"the standard library's {top!r}"
        if _installed(top):
            return f"the installed package {top!r}"
    module = module_of(path)
    for test_module in test_modules:
        if test_module.startswith(module + "."):
            return f"the package of the test module {test_module!r}"
    return ""


def _installed(name: str) -> bool:
    """Whether the interpreter imports a top-level module `name` from its own paths (not the
    working directory, and not a bare directory: a namespace package shadows nothing)."""
    paths = [p for p in sys.path if p and os.path.abspath(p) != os.getcwd()]
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, paths)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def _top_name(path: str) -> str:
    """The top-level module or package name a repository path provides (`src/a.py` -> `src`)."""
    first, slash, _ = path.partition("/")
    return first if slash else first.removesuffix(".py")


def sandbox_job(files: Mapping[str, str], tests: Sequence[Mapping[str, Any]]) -> Job:
    """The sandbox job that runs `tests` on `files` (all of them, stopping at the first failure),
    with the test ids' literal expectations moved from their files into the judge's outputs."""
    files = dict(files)
    by_file: dict[str, list[str]] = {}
    for test in tests:
        if "test" in test:
            path, _, name = str(test["test"]).partition("::")
            by_file.setdefault(path, []).append(name)
    expected: dict[str, list[Any]] = {}
    for path, names in by_file.items():
        if path in files:
            lifted = lift_asserts(files[path], names)
            files[path] = lifted.source
            expected.update({f"{path}::{name}": values for name, values in lifted.expected.items()})
    sandbox_tests: list[dict[str, Any]] = []
    for test in tests:
        if "test" in test:
            test_id = str(test["test"])
            sandbox_tests.append(
                {
                    "args": ["test", test_id, ""],
                    "output": {"passed": True, "values": expected.get(test_id, [])},
                }
            )
        else:
            sandbox_tests.append(
                {"args": ["value", str(test["module"]), str(test["expr"])], "output": test["output"]}
            )
    code = f"_REPO = __import__('json').loads({json.dumps(json.dumps(dict(files)))})\n" + DRIVER
    return Job(code, sandbox_tests, ENTRY_POINT, stop_on_failure=True)


def module_of(path: str) -> str:
    """The dotted module name of a repository file (`src/util.py` -> `src.util`)."""
    stem = path[: -len(".py")] if path.endswith(".py") else path
    if stem.endswith("/__init__"):
        stem = stem[: -len("/__init__")]
    return stem.replace("/", ".")


DRIVER = '''
import builtins, importlib, importlib.machinery, json, sys

_SEEN = []


def _expect(value):
    """A lifted assertion's computed value, kept as plain JSON data (anything else fails here)."""
    _SEEN.append(json.loads(json.dumps(value, allow_nan=False)))


setattr(builtins, "__RECORDER__", _expect)


class _RepoImporter:
    """Serves the repository's modules from _REPO (first on sys.meta_path, like a repo root)."""

    def find_spec(self, name, path=None, target=None):
        rel = name.replace(".", "/")
        if rel + ".py" in _REPO:
            return importlib.machinery.ModuleSpec(name, self, origin=rel + ".py")
        if rel + "/__init__.py" in _REPO:
            spec = importlib.machinery.ModuleSpec(name, self, origin=rel + "/__init__.py", is_package=True)
            spec.submodule_search_locations = []
            return spec
        if any(p.startswith(rel + "/") for p in _REPO):
            spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
            spec.submodule_search_locations = []
            return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        origin = module.__spec__.origin
        if origin in _REPO:
            module.__file__ = origin
            exec(compile(_REPO[origin], origin, "exec"), module.__dict__)


sys.meta_path.insert(0, _RepoImporter())
sys.dont_write_bytecode = True


def _module(path_or_name):
    if path_or_name.endswith(".py"):
        path_or_name = path_or_name[:-3].replace("/", ".")
        if path_or_name.endswith(".__init__"):
            path_or_name = path_or_name[: -len(".__init__")]
    return importlib.import_module(path_or_name)


def _run_test(test_id):
    del _SEEN[:]
    path, *names = test_id.split("::")
    target = _module(path)
    if len(names) == 2:
        import unittest  # only here: importing it costs more than a small repository's tests

        cls = getattr(target, names[0])
        if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
            result = unittest.TestResult()
            cls(names[1]).run(result)
            if result.wasSuccessful() and not result.skipped:
                return {"passed": True, "values": list(_SEEN)}
            problems = result.failures + result.errors
            return "failed: " + (problems[0][1].strip().splitlines()[-1] if problems else "skipped")
        getattr(cls(), names[1])()
    else:
        getattr(target, names[0])()
    return {"passed": True, "values": list(_SEEN)}


def cascade_swe_check(kind, target, expr):
    if kind == "value":
        return eval(expr, vars(_module(target)))
    try:
        return _run_test(target)
    except Exception as err:
        return "failed: " + type(err).__name__ + ": " + str(err)[:200]
'''.replace("__RECORDER__", RECORDER)

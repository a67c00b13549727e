"""Test ids' literal expectations lifted out of the sandboxed process (`swe_asserts`), and the
patches refused for shadowing a module the tests or the driver import (`swe_exec`)."""

from __future__ import annotations

import pytest

from cascade.domains.patches import parse_patch
from cascade.domains.swe_asserts import RECORDER, lift_asserts
from cascade.domains.swe_exec import PatchRejected, apply_to_repo, sandbox_job, shadowed_module

TEST_FILE = """import unittest
from calc import total


def test_total():
    expected = 6
    assert total([1, 2, 3]) == 6, "sum"
    assert 0 == total([])
    assert total(None) is None
    for i in range(2):
        assert total([i]) == i
    assert total([1]) == expected
    assert total([1, 2]) == (1, 2)


class TestTotal(unittest.TestCase):
    def test_one(self):
        self.assertEqual(total([2]), 2)
        self.assertEqual({"a": [1.5]}, total([]))
        self.assertIsNone(total(None))
        self.assertTrue(total([1]))
"""


def test_top_level_literal_assertions_leave_the_file() -> None:
    lifted = lift_asserts(TEST_FILE, ["test_total", "TestTotal::test_one", "test_absent", "TestTotal::nope"])
    assert lifted.expected == {"test_total": [6, 0, None], "TestTotal::test_one": [2, {"a": [1.5]}, None]}
    body = lifted.source
    assert f"{RECORDER}(total([1, 2, 3]))" in body and f"{RECORDER}(total([]))" in body
    # the literals the judge holds are no longer in the file the sandbox receives
    assert "== 6" not in body and "0 ==" not in body and "1.5" not in body
    # kept as written: inside a loop, a computed expectation, a tuple (JSON would make it a list),
    # a truth test
    assert "assert total([i]) == i" in body
    assert "assert total([1]) == expected" in body
    assert "assert total([1, 2]) == (1, 2)" in body
    assert "self.assertTrue(total([1]))" in body


def test_a_file_without_liftable_assertions_is_unchanged() -> None:
    source = "def test_x():\n    assert f() == g()  # nothing literal\n"
    assert lift_asserts(source, ["test_x"]).source == source
    assert lift_asserts("def test_x(:\n", ["test_x"]).source == "def test_x(:\n"


def test_the_judge_holds_the_literals_and_the_program_only_the_computation() -> None:
    files = {"calc.py": "def total(xs):\n    return sum(xs)\n", "tests/test_calc.py": TEST_FILE}
    job = sandbox_job(
        files,
        [{"test": "tests/test_calc.py::test_total"}, {"test": "tests/test_calc.py::TestTotal::test_one"}],
    )
    assert [t["output"] for t in job.tests] == [
        {"passed": True, "values": [6, 0, None]},
        {"passed": True, "values": [2, {"a": [1.5]}, None]},
    ]
    assert "1.5" not in job.code


REPO = {"calc.py": "x = 1\n", "tests/test_calc.py": "from calc import x\n", "pkg/__init__.py": ""}


@pytest.mark.parametrize(
    ("path", "shadowed"),
    [
        ("unittest.py", "standard library's 'unittest'"),
        ("json/__init__.py", "standard library's 'json'"),
        ("json/notes.txt", "standard library's 'json'"),
        ("pytest.py", "installed package 'pytest'"),
        ("tests.py", "package of the test module 'tests.test_calc'"),
    ],
)
def test_a_new_file_that_shadows_is_refused(path: str, shadowed: str) -> None:
    assert shadowed in shadowed_module(path, REPO, ["tests.test_calc"])
    patch = parse_patch(f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+y = 2\n")
    with pytest.raises(PatchRejected, match="would shadow"):
        apply_to_repo(REPO, patch, frozenset())


@pytest.mark.parametrize(
    "path", ["newmod.py", "pkg/json.py", "pkg/unittest/__init__.py", "src/new.py", "NOTES.md"]
)
def test_new_files_that_shadow_nothing_are_applied(path: str) -> None:
    assert shadowed_module(path, REPO, ["tests.test_calc"]) == ""
    patch = parse_patch(f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+y = 2\n")
    assert apply_to_repo(REPO, patch, frozenset())[path] == "y = 2\n"

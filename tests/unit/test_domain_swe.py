"""swe domain: unified-diff parsing, lexical similarity, the patch reward and the generator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from cascade.domains.base import INFRA_ERROR, OK, OUTPUT_LIMIT, PARSE_ERROR, WRONG_ANSWER, Problem
from cascade.domains.patches import (
    PatchParseError,
    apply_file_patch,
    file_overlap_and_content,
    lexical_similarity,
    parse_patch,
    patches_equal,
)
from cascade.domains.swe import (
    BUG_KINDS,
    NO_CHANGE,
    LexicalScorer,
    SemanticScorer,
    SweDomain,
    extract_patch,
)

GOLD = """\
--- a/src/util.py
+++ b/src/util.py
@@ -1,4 +1,4 @@
 def add(a, b):
     \"\"\"Return the sum of a and b.\"\"\"
-    return a - b
+    return a + b
 
"""

TWO_FILES = """\
diff --git a/src/util.py b/src/util.py
index 1234567..89abcde 100644
--- a/src/util.py\t2024-01-01 00:00:00
+++ b/src/util.py\t2024-01-01 00:00:01
@@ -1,2 +1,2 @@ def add(a, b):
 def add(a, b):
-    return a - b
+    return a + b
@@ -10 +10,2 @@
-x = 1
+x = 2
+y = 3
\\ No newline at end of file
diff --git a/docs/new.md b/docs/new.md
new file mode 100644
--- /dev/null
+++ b/docs/new.md
@@ -0,0 +1 @@
+# Title
"""


def problem(answer: str = GOLD) -> Problem:
    return Problem(id="swe-test-0", domain="swe", prompt="fix add", answer=answer, meta={})


# --------------------------------------------------------------------------- parsing


def test_parse_files_hunks_and_lines() -> None:
    patch = parse_patch(TWO_FILES, strict_counts=True)
    assert [f.path for f in patch.files] == ["src/util.py", "docs/new.md"]
    util, doc = patch.files
    assert (util.old_path, util.new_path, doc.old_path, doc.new_path) == (
        "src/util.py",
        "src/util.py",
        None,
        "docs/new.md",
    )
    first, second = util.hunks
    assert (first.old_start, first.old_len, first.new_start, first.new_len) == (1, 2, 1, 2)
    assert first.section == "def add(a, b):"
    assert first.lines == ((" ", "def add(a, b):"), ("-", "    return a - b"), ("+", "    return a + b"))
    assert (second.old_len, second.new_len, second.removed, second.added) == (
        1,
        2,
        ["x = 1"],
        ["x = 2", "y = 3"],
    )
    assert doc.hunks[0].added == ["# Title"]
    assert patch.changed_line_count == 6
    assert patch.changes == {
        "src/util.py": ("-return a - b", "+return a + b", "-x = 1", "+x = 2", "+y = 3"),
        "docs/new.md": ("+# Title",),
    }


def test_blank_text_is_an_empty_patch_and_prose_around_is_skipped() -> None:
    assert parse_patch("").files == () and parse_patch("  \n\n").files == ()
    wrapped = "Here is the fix:\n\n" + GOLD + "\nThis makes add return the sum.\n"
    assert parse_patch(wrapped).changes == parse_patch(GOLD).changes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I am not sure how to fix this.", "no file header"),
        ("--- a/x.py\nsome text\n", "not followed by a '\\+\\+\\+ ' line"),
        ("+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n", "without a '--- ' line"),
        ("--- a/x.py\n+++ b/x.py\n", "has no hunk"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1 +1\n-a\n+b\n", "malformed hunk header"),
        ("@@ -1 +1 @@\n-a\n+b\n", "hunk header before any"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\nnot a hunk line\n", "hunk has no lines"),
        ("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+a\n", "both sides"),
    ],
)
def test_malformed_patches_raise(text: str, message: str) -> None:
    with pytest.raises(PatchParseError, match=message):
        parse_patch(text)


def test_hunk_counts_are_checked_only_when_strict() -> None:
    miscounted = "--- a/x.py\n+++ b/x.py\n@@ -1,5 +1,5 @@\n-a\n+b\n"
    assert parse_patch(miscounted).changes == {"x.py": ("-a", "+b")}
    with pytest.raises(PatchParseError, match="header says -5 \\+5 lines, body has -1 \\+1"):
        parse_patch(miscounted, strict_counts=True)
    # A miscounted hunk does not swallow the next file's header.
    two = miscounted + "--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-c\n+d\n"
    assert parse_patch(two).changes == {"x.py": ("-a", "+b"), "y.py": ("-c", "+d")}


def test_apply_file_patch() -> None:
    source = "def add(a, b):\n    return a - b\n" + "\n" * 7 + "x = 1"
    patch = parse_patch(TWO_FILES)
    assert apply_file_patch(source, patch.files[0]) == (
        "def add(a, b):\n    return a + b\n" + "\n" * 7 + "x = 2\ny = 3\n"
    )
    assert apply_file_patch("", patch.files[1]) == "# Title\n"
    with pytest.raises(PatchParseError, match="does not match"):
        apply_file_patch("something else\n", patch.files[0])


# --------------------------------------------------------------------------- similarity


def test_similarity_formula_by_hand() -> None:
    gold = parse_patch(GOLD)
    # Tokens per line: tag, return, a, op, b, end-of-line (6); one operator differs: M = 11 of 12 + 12.
    wrong_op = parse_patch(GOLD.replace("a + b", "a * b"))
    assert file_overlap_and_content(wrong_op, gold) == (1.0, pytest.approx(22 / 24))
    assert lexical_similarity(wrong_op, gold) == pytest.approx((1 + 22 / 24) / 2)
    # Gold changes A and B; the prediction changes A exactly and C: Jaccard 1/3, content (1+0+0)/3.
    gold2 = parse_patch("--- a/A\n+++ b/A\n@@ -1 +1 @@\n-x\n+y\n--- a/B\n+++ b/B\n@@ -1 +1 @@\n-p\n+q\n")
    pred2 = parse_patch("--- a/A\n+++ b/A\n@@ -1 +1 @@\n-x\n+y\n--- a/C\n+++ b/C\n@@ -1 +1 @@\n-p\n+q\n")
    assert lexical_similarity(pred2, gold2) == pytest.approx((1 / 3 + 1 / 3) / 2)
    assert lexical_similarity(gold, gold) == 1.0
    assert lexical_similarity(parse_patch(GOLD.replace("src/util.py", "src/other.py")), gold) == 0.0
    assert lexical_similarity(parse_patch(""), parse_patch("")) == 1.0
    assert LexicalScorer().similarity(GOLD, GOLD) == 1.0


def test_equality_ignores_whitespace_context_and_positions() -> None:
    variant = (
        "--- a/src/util.py\n+++ b/src/util.py\n@@ -7,2 +7,2 @@\n"
        "-\treturn   a - b  \n+  return a  +  b\n+   \n"
    )
    assert patches_equal(parse_patch(variant), parse_patch(GOLD))
    assert not patches_equal(parse_patch(GOLD.replace("a + b", "b + a")), parse_patch(GOLD))


# --------------------------------------------------------------------------- reward


def test_exact_gold_scores_one() -> None:
    verdict = SweDomain().score(problem(), GOLD)
    assert (verdict.reward, verdict.reason) == (1.0, OK)
    fenced = "<think>the sign is wrong</think>\nThe fix:\n```diff\n" + GOLD + "```\nDone."
    assert SweDomain().score(problem(), fenced).reward == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        GOLD.replace("    return a + b", "\treturn  a + b   "),
        GOLD.replace("\n", "\r\n"),
        GOLD.replace("@@ -1,4 +1,4 @@", "@@ -1,5 +1,6 @@").replace(
            "+    return a + b", "+    return a + b\n+"
        ),
        "```patch\n" + GOLD.replace("-    return a - b", "-return a - b") + "```",
    ],
)
def test_whitespace_only_differences_score_one(completion: str) -> None:
    verdict = SweDomain().score(problem(), completion)
    assert (verdict.reward, verdict.reason) == (1.0, OK), verdict


@pytest.mark.parametrize(
    ("completion", "detail"),
    [
        ("", "empty patch"),
        ("<think>hmm</think>   ", "empty patch"),
        ("```diff\n```", "empty patch"),
        (
            "--- a/src/util.py\n+++ b/src/util.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n     pass\n",
            "changes nothing",
        ),
        (
            "--- a/src/util.py\n+++ b/src/util.py\n@@ -1 +1 @@\n-    return a - b\n+    return  a - b\n",
            "nothing",
        ),
        ("--- a/src/util.py\n+++ b/src/util.py\n@@ -1 +1,2 @@\n context\n+\n", "changes nothing"),
    ],
)
def test_patches_that_change_nothing(completion: str, detail: str) -> None:
    verdict = SweDomain().score(problem(), completion)
    assert (verdict.reward, verdict.reason) == (0.0, NO_CHANGE)
    assert detail in verdict.detail


@pytest.mark.parametrize(
    "completion",
    [
        "I think you should change the minus to a plus.",
        "```diff\n@@ -1 +1 @@\n-a\n+b\n```",
        "--- a/src/util.py\n+++ b/src/util.py\n@@ one @@\n-a\n+b\n",
    ],
)
def test_garbage_is_a_parse_error(completion: str) -> None:
    verdict = SweDomain().score(problem(), completion)
    assert (verdict.reward, verdict.reason) == (-1.0, PARSE_ERROR)
    assert verdict.detail


def test_partial_patch_scores_between_wrong_file_and_gold() -> None:
    domain = SweDomain()
    wrong_file = domain.score(problem(), GOLD.replace("src/util.py", "src/other.py"))
    partial = domain.score(problem(), GOLD.replace("a + b", "a * b"))
    gold = domain.score(problem(), GOLD)
    assert (wrong_file.reward, wrong_file.reason) == (0.0, WRONG_ANSWER)
    assert partial.reason == OK and partial.detail.startswith("partial credit")
    assert wrong_file.reward < partial.reward < gold.reward == 1.0
    assert partial.reward == pytest.approx((1 + 22 / 24) / 2)
    # Right line in the right file plus a stray extra file: less than the file-exact partial.
    extra = GOLD.replace("a + b", "a * b") + "--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-x\n+y\n"
    assert wrong_file.reward < domain.score(problem(), extra).reward < partial.reward


def test_over_cap_patches_are_output_limit() -> None:
    assert (SweDomain().max_patch_chars, SweDomain().max_changed_lines) == (20_000, 400)
    long_line = GOLD.replace("a + b", "a + b  # " + "x" * 300)
    verdict = SweDomain(max_patch_chars=200).score(problem(), long_line)
    assert (verdict.reward, verdict.reason) == (-1.0, OUTPUT_LIMIT) and "cap 200" in verdict.detail
    many = "--- a/src/util.py\n+++ b/src/util.py\n@@ -1,3 +1,3 @@\n" + "-a\n+b\n" * 3
    verdict = SweDomain(max_changed_lines=5).score(problem(), many)
    assert (verdict.reward, verdict.reason) == (-1.0, OUTPUT_LIMIT) and "changes 6 lines" in verdict.detail
    huge = "--- a/src/util.py\n+++ b/src/util.py\n@@ -1,500 +1,500 @@\n" + "-a\n+b\n" * 500
    assert SweDomain().score(problem(), huge).reason == OUTPUT_LIMIT
    assert SweDomain(max_changed_lines=6).score(problem(), many).reason == OK
    with pytest.raises(ValueError, match="caps"):
        SweDomain(max_patch_chars=0)


def test_bad_gold_is_infra_error() -> None:
    assert SweDomain().score(problem("not a diff"), GOLD).reason == INFRA_ERROR
    noop_gold = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n same\n"
    assert SweDomain().score(problem(noop_gold), GOLD).reason == INFRA_ERROR


def test_extract_patch() -> None:
    assert extract_patch("```diff\n" + GOLD + "```") == GOLD.rstrip("\n")
    two_blocks = "```diff\n--- a/x\n+++ b/x\n```\nand\n```diff\n@@ -1 +1 @@\n-a\n+b\n```"
    assert extract_patch(two_blocks) == "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b"
    shown = "```python\ndef add(a, b):\n    return a + b\n```\n```\n" + GOLD + "```"
    assert extract_patch(shown) == GOLD.rstrip("\n")
    assert extract_patch("Here it is:\n" + GOLD) == GOLD.rstrip()  # the response is stripped
    assert extract_patch("<think>--- a/x</think>no diff") == "no diff"
    assert extract_patch("```diff\n" + GOLD) == GOLD.rstrip()  # unclosed fence


# --------------------------------------------------------------------------- semantic blend


@dataclass
class FixedScorer:
    value: float
    calls: int = 0

    def similarity(self, pred: str, gold: str) -> float:
        self.calls += 1
        return self.value


class BrokenScorer:
    def similarity(self, pred: str, gold: str) -> float:
        raise RuntimeError("judge offline")


def test_semantic_scorer_blends_by_weight() -> None:
    partial = GOLD.replace("a + b", "a * b")
    lexical = (1 + 22 / 24) / 2
    scorer = FixedScorer(0.2)
    assert isinstance(scorer, SemanticScorer) and isinstance(LexicalScorer(), SemanticScorer)
    verdict = SweDomain(semantic_scorer=scorer, semantic_weight=0.25).score(problem(), partial)
    assert verdict.reason == OK
    assert verdict.reward == pytest.approx(0.75 * lexical + 0.25 * 0.2)
    assert "semantic 0.200, weight 0.25" in verdict.detail
    default_weight = SweDomain(semantic_scorer=FixedScorer(1.0)).score(problem(), partial)
    assert default_weight.reward == pytest.approx(0.5 * lexical + 0.5 * 1.0)
    clamped = SweDomain(semantic_scorer=FixedScorer(7.0), semantic_weight=1.0).score(problem(), partial)
    assert clamped.reward == 1.0
    wrong_file = GOLD.replace("src/util.py", "src/other.py")
    rescued = SweDomain(semantic_scorer=FixedScorer(0.4), semantic_weight=0.5).score(problem(), wrong_file)
    assert (rescued.reward, rescued.reason) == (pytest.approx(0.2), OK)
    # Exact matches, no-ops and parse errors never consult the scorer.
    counting = FixedScorer(0.0)
    domain = SweDomain(semantic_scorer=counting)
    assert [domain.score(problem(), c).reward for c in (GOLD, "", "junk")] == [1.0, 0.0, -1.0]
    assert counting.calls == 0
    assert SweDomain(semantic_scorer=BrokenScorer()).score(problem(), partial).reason == INFRA_ERROR
    with pytest.raises(ValueError, match="semantic_weight"):
        SweDomain(semantic_weight=1.5)


def test_from_config() -> None:
    @dataclass(frozen=True)
    class Settings:
        max_patch_chars: int = 100
        max_changed_lines: int = 3
        semantic_weight: float = 0.1

    domain = SweDomain.from_config(Settings(), semantic_scorer=FixedScorer(0.5))
    assert (domain.max_patch_chars, domain.max_changed_lines, domain.semantic_weight) == (100, 3, 0.1)
    assert domain.semantic_scorer is not None and domain.config == Settings()
    assert SweDomain().config is None


# --------------------------------------------------------------------------- generator


def _run_tests(source: str, tests: list[str]) -> list[bool]:
    results = []
    for test in tests:
        namespace: dict[str, Any] = {}
        try:
            exec(source, namespace)
            results.append(bool(eval(test, namespace)))
        except Exception:
            results.append(False)
    return results


def test_every_reference_scores_one_and_really_fixes_the_bug() -> None:
    domain = SweDomain()
    problems = domain.make_problems("train", 150, 0) + domain.make_problems("eval", 40, 0)
    problems += domain.make_problems("sft", 40, 0)
    verdicts = domain.score_batch(problems, [p.answer for p in problems])
    assert {(v.reward, v.reason) for v in verdicts} == {(1.0, OK)}
    for p in problems:
        path = p.meta["path"]
        assert p.answer.startswith(f"--- a/{path}\n+++ b/{path}\n@@ ")
        assert f"{path}:\n```python\n{p.meta['source']}```" in p.prompt
        patch = parse_patch(p.answer, strict_counts=True)
        assert apply_file_patch(p.meta["source"], patch.files[0]) == p.meta["fixed"]
        assert all(_run_tests(p.meta["fixed"], p.meta["tests"])), p.id
        assert not all(_run_tests(p.meta["source"], p.meta["tests"])), p.id
    assert {p.meta["bug"] for p in problems} == set(BUG_KINDS)
    wrong = domain.score_batch(problems[:20], [p.answer.replace("+", "-", 1) for p in problems[:20]])
    assert all(v.reward < 1.0 for v in wrong)


def test_splits_are_disjoint_and_deterministic() -> None:
    domain = SweDomain()
    train = domain.make_problems("train", 300, 3)
    assert train == domain.make_problems("train", 300, 3)
    assert train != domain.make_problems("train", 300, 4)
    evals, sft = domain.make_problems("eval", 100, 3), domain.make_problems("sft", 100, 3)
    prompts = [{p.prompt for p in ps} for ps in (train, evals, sft)]
    assert [len(s) for s in prompts] == [300, 100, 100]
    assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2] and not prompts[1] & prompts[2]
    assert (train[0].id, evals[5].id, sft[7].id) == ("swe-train-0", "swe-eval-5", "swe-sft-7")
    assert {p.domain for p in train + evals + sft} == {"swe"}


def test_score_batch_checks_lengths() -> None:
    with pytest.raises(ValueError, match="1 problems but 2 completions"):
        SweDomain().score_batch([problem()], [GOLD, GOLD])

"""swe domain: unified-diff parsing, the three patch rewards (execution, exact-or-judge, similarity),
applying patches to a repository, the judge, the adapter's runnable rows and the generator."""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cascade.config import DomainConfig, HfPrompts, SweReward
from cascade.domains.base import INFRA_ERROR, OK, OUTPUT_LIMIT, PARSE_ERROR, WRONG_ANSWER, Problem
from cascade.domains.hf_adapters import ADAPTERS
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
    fenced_blocks,
)
from cascade.domains.swe_exec import PatchRejected, apply_to_repo, is_test_path, safe_path
from cascade.domains.swe_judge import HfPatchJudge, JudgeInputTooLong, PatchJudge

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

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
    """A problem without a repository or tests (scored execution-free in every mode)."""
    return Problem(id="swe-test-0", domain="swe", prompt="fix add", answer=answer, meta={})


def similarity(**kwargs: Any) -> SweDomain:
    return SweDomain(mode="similarity", **kwargs)


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
    # The nearest match to the header's position wins, the earlier one on a tie.
    repeated = "a\nb\na\nb\na\n"
    at_3 = parse_patch("--- a/r\n+++ b/r\n@@ -3,1 +3,1 @@\n-a\n+X\n").files[0]
    assert apply_file_patch(repeated, at_3) == "a\nb\nX\nb\na\n"
    at_4 = parse_patch("--- a/r\n+++ b/r\n@@ -4,1 +4,1 @@\n-a\n+X\n").files[0]
    assert apply_file_patch(repeated, at_4) == "a\nb\nX\nb\na\n"
    too_long = parse_patch("--- a/r\n+++ b/r\n@@ -1,9 +1,9 @@\n" + " a\n b\n" * 4 + "-a\n+X\n").files[0]
    with pytest.raises(PatchParseError, match="does not match"):
        apply_file_patch(repeated, too_long)
    insert = parse_patch("--- a/r\n+++ b/r\n@@ -99,0 +99,1 @@\n+end\n").files[0]
    assert apply_file_patch(repeated, insert) == repeated + "end\n"


def test_applying_far_hunks_in_a_long_file_is_fast() -> None:
    """Hunks matching far from their header once made a Python loop over the whole file each
    (a 20,000-character patch kept a reward worker busy ~9 s on a 10,000-line file)."""
    source = "\n".join(f"x{i} = {i}" for i in range(10_000)) + "\n"
    context_only = "@@ -1,1 +1,1 @@\n x9999 = 9999\n" * 300
    far = "".join(f"@@ -1 +1 @@\n-x{9999 - i} = {9999 - i}\n+y{i}\n" for i in range(200))
    patch = parse_patch("--- a/f.py\n+++ b/f.py\n" + context_only + far).files[0]
    start = time.perf_counter()
    patched = apply_file_patch(source, patch).splitlines()
    assert time.perf_counter() - start < 1.0
    assert patched[:2] == ["x0 = 0", "x1 = 1"] and patched[-2:] == ["y1", "y0"] and len(patched) == 10_000


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
    domain = similarity()
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
    assert similarity(max_changed_lines=6).score(problem(), many).reason == OK
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
    verdict = similarity(semantic_scorer=scorer, semantic_weight=0.25).score(problem(), partial)
    assert verdict.reason == OK
    assert verdict.reward == pytest.approx(0.75 * lexical + 0.25 * 0.2)
    assert "semantic 0.200, weight 0.25" in verdict.detail
    default_weight = similarity(semantic_scorer=FixedScorer(1.0)).score(problem(), partial)
    assert default_weight.reward == pytest.approx(0.5 * lexical + 0.5 * 1.0)
    clamped = similarity(semantic_scorer=FixedScorer(7.0), semantic_weight=1.0).score(problem(), partial)
    assert clamped.reward == 1.0
    wrong_file = GOLD.replace("src/util.py", "src/other.py")
    rescued = similarity(semantic_scorer=FixedScorer(0.4), semantic_weight=0.5).score(problem(), wrong_file)
    assert (rescued.reward, rescued.reason) == (pytest.approx(0.2), OK)
    # Exact matches, no-ops and parse errors never consult the scorer.
    counting = FixedScorer(0.0)
    domain = similarity(semantic_scorer=counting)
    assert [domain.score(problem(), c).reward for c in (GOLD, "", "junk")] == [1.0, 0.0, -1.0]
    assert counting.calls == 0
    assert similarity(semantic_scorer=BrokenScorer()).score(problem(), partial).reason == INFRA_ERROR
    with pytest.raises(ValueError, match="semantic_weight"):
        similarity(semantic_weight=1.5)


def test_from_config() -> None:
    config = SweReward(mode="similarity", max_patch_chars=100, max_changed_lines=3, semantic_weight=0.1)
    domain = SweDomain.from_config(config, semantic_scorer=FixedScorer(0.5))
    assert (domain.max_patch_chars, domain.max_changed_lines, domain.semantic_weight) == (100, 3, 0.1)
    assert domain.mode == "similarity" and domain.semantic_scorer is not None and domain.config == config
    executing = SweDomain.from_config(SweReward(time_limit_s=3, memory_mb=128, sandbox_uid=62000))
    assert executing.mode == "execution" and executing.judge is None
    assert (executing.limits.time_limit_s, executing.limits.memory_mb, executing.settings.uid) == (
        3,
        128,
        62000,
    )
    assert SweDomain().config is None and SweDomain().mode == "execution"
    with pytest.raises(ValueError, match="semantic_scorer is used only by mode 'similarity'"):
        SweDomain(semantic_scorer=FixedScorer(0.5))
    with pytest.raises(ValueError, match="judge is used only"):
        SweDomain(mode="similarity", judge=FixedJudge(0.5))
    with pytest.raises(ValueError, match="mode must be one of"):
        SweDomain(mode="fuzzy")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "fuzzy"}, "mode"),
        (
            {"semantic_weight": 0.3},
            "semantic_weight is read only by mode 'similarity' \\(mode is 'execution'\\)",
        ),
        ({"mode": "exact_or_judge", "semantic_weight": 0.3}, "semantic_weight is read only"),
        ({"mode": "similarity", "judge_model_path": "models/judge"}, "judge_model_path is read only"),
        ({"judge_device": "tpu"}, "judge_device"),
        ({"max_completion_chars": 0}, "max_completion_chars"),
    ],
)
def test_config_errors_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SweReward(**fields)


def test_config_modes_and_weight() -> None:
    assert SweReward().mode == "execution" and SweReward().heavy
    assert not SweReward(mode="exact_or_judge").heavy and not SweReward(mode="similarity").heavy
    assert SweReward(mode="exact_or_judge", judge_model_path=Path("m")).heavy
    assert SweReward(mode="similarity", semantic_weight=0.3).semantic_weight == 0.3
    assert "KNOWN TO BE GAMEABLE" in (SweReward.__doc__ or "")
    for config in (SweReward(), SweReward(mode="similarity", semantic_weight=0.2)):  # a full dump loads
        assert SweReward.model_validate(config.model_dump()) == config


# --------------------------------------------------------------------------- exact or judge


@dataclass
class FixedJudge:
    value: float
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def judge(self, issue: str, gold: str, patch: str) -> float:
        self.calls.append((issue, gold, patch))
        return self.value


class BrokenJudge:
    def judge(self, issue: str, gold: str, patch: str) -> float:
        raise RuntimeError("judge offline")


def test_exact_or_judge_pays_partial_credit_only_from_the_judge() -> None:
    partial = GOLD.replace("a + b", "a * b")
    assert isinstance(FixedJudge(0.0), PatchJudge)
    bare = SweDomain(mode="exact_or_judge")
    assert (bare.score(problem(), GOLD).reward, bare.score(problem(), GOLD).reason) == (1.0, OK)
    unjudged = bare.score(problem(), partial)
    assert (unjudged.reward, unjudged.reason) == (0.0, WRONG_ANSWER) and "no judge" in unjudged.detail
    judge = FixedJudge(0.3)
    judged = SweDomain(mode="exact_or_judge", judge=judge)
    verdict = judged.score(problem(), "```diff\n" + partial + "```")
    assert (verdict.reward, verdict.reason) == (pytest.approx(0.3), OK) and "0.300" in verdict.detail
    assert judge.calls == [("fix add", GOLD, partial.rstrip("\n"))]
    # Exact matches, no-ops and parse errors never consult the judge.
    assert [judged.score(problem(), c).reward for c in (GOLD, "", "junk")] == [1.0, 0.0, -1.0]
    assert len(judge.calls) == 1
    assert (
        SweDomain(mode="exact_or_judge", judge=FixedJudge(0.0)).score(problem(), partial).reason
        == WRONG_ANSWER
    )
    for bad in (BrokenJudge(), FixedJudge(float("nan")), FixedJudge(1.5)):
        assert SweDomain(mode="exact_or_judge", judge=bad).score(problem(), partial).reason == INFRA_ERROR
    # The execution mode scores a problem without tests the same way.
    assert SweDomain(judge=FixedJudge(0.4)).score(problem(), partial).reward == pytest.approx(0.4)
    assert SweDomain().score(problem(), partial).reward == 0.0


SHORT_GOLD = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a - b\n+a + b\n"
SHORT_PARTIAL = SHORT_GOLD.replace("a + b", "a * b")


def test_hf_judge_on_the_random_tiny_model(random_tiny_model: Path) -> None:
    """Plumbing only: the random model's P(yes) is a probability, deterministic, and the reward."""
    judge = HfPatchJudge(random_tiny_model, max_length=200)
    issue = "add returns the difference " * 100
    p = judge.judge(issue, SHORT_GOLD, SHORT_PARTIAL)
    assert 0.0 < p < 1.0 and judge.judge(issue, SHORT_GOLD, SHORT_PARTIAL) == p
    answer = max(len(judge.yes_ids), len(judge.no_ids))
    assert len(judge.prompt_ids(issue, SHORT_GOLD, SHORT_PARTIAL)) + answer == 200  # the issue is cut
    with pytest.raises(JudgeInputTooLong, match="without the issue"):
        judge.prompt_ids("x", SHORT_GOLD * 20, SHORT_PARTIAL)
    # A patch too long for the judge is a verdict on the completion, not the judge's failure.
    short = problem(SHORT_GOLD)
    too_long = SweDomain(mode="exact_or_judge", judge=judge).score(short, SHORT_PARTIAL * 10)
    assert (too_long.reward, too_long.reason) == (0.0, WRONG_ANSWER) and "too long" in too_long.detail
    config = SweReward(mode="exact_or_judge", judge_model_path=random_tiny_model, judge_max_length=250)
    domain = SweDomain.from_config(config)
    assert isinstance(domain.judge, HfPatchJudge)
    verdict = domain.score(short, SHORT_PARTIAL)
    assert verdict.reason == OK
    assert verdict.reward == pytest.approx(
        domain.judge.judge("fix add", SHORT_GOLD, SHORT_PARTIAL.rstrip("\n"))
    )
    assert domain.score(short, SHORT_GOLD).reward == 1.0
    with pytest.raises(FileNotFoundError):
        HfPatchJudge(random_tiny_model / "missing")


# --------------------------------------------------------------------------- execution

REPO = {"src/calc.py": "def add(a, b):\n    return a - b\n", "README.md": "calc\n"}
CALC_GOLD = (
    "--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,2 @@\n"
    " def add(a, b):\n-    return a - b\n+    return a + b\n"
)


def runnable(tests: list[dict[str, Any]] | None = None, repo: dict[str, str] | None = None) -> Problem:
    checks = tests or [
        {"module": "src.calc", "expr": "add(2, 3)", "output": 5},
        {"module": "src.calc", "expr": "add(-1, 1)", "output": 0},
    ]
    meta = {"repo_files": repo or REPO, "swe_tests": checks}
    return Problem(id="swe-run-0", domain="swe", prompt="add subtracts", answer=CALC_GOLD, meta=meta)


def test_safe_paths_and_test_paths() -> None:
    assert safe_path("src/util.py") == "src/util.py"
    for bad in (
        "../x.py",
        "src/../../x.py",
        "/etc/passwd",
        "a\\b.py",
        "./x.py",
        "a//b.py",
        "x\x00.py",
        ".",
        "",
    ):
        with pytest.raises(PatchRejected):
            safe_path(bad)
    for path in (
        "tests/test_a.py",
        "pkg/test/helpers.py",
        "conftest.py",
        "a/conftest.py",
        "test_x.py",
        "x_test.py",
    ):
        assert is_test_path(path), path
    for path in ("src/util.py", "src/testing_utils.py", "contest.py", "latest.py"):
        assert not is_test_path(path), path
    assert is_test_path("checks.py", frozenset({"checks.py"}))


def test_apply_to_repo_creates_deletes_renames_and_refuses() -> None:
    applied = apply_to_repo(REPO, parse_patch(CALC_GOLD), frozenset())
    assert applied == {**REPO, "src/calc.py": "def add(a, b):\n    return a + b\n"} and REPO[
        "src/calc.py"
    ].endswith("a - b\n")
    created = apply_to_repo(
        REPO, parse_patch("--- /dev/null\n+++ b/src/new.py\n@@ -0,0 +1 @@\n+x = 1\n"), frozenset()
    )
    assert created["src/new.py"] == "x = 1\n"
    deleted = apply_to_repo(
        REPO, parse_patch("--- a/README.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-calc\n"), frozenset()
    )
    assert "README.md" not in deleted
    renamed = apply_to_repo(
        REPO, parse_patch("--- a/README.md\n+++ b/docs/README.md\n@@ -1 +1 @@\n-calc\n+Calc\n"), frozenset()
    )
    assert renamed["docs/README.md"] == "Calc\n" and "README.md" not in renamed
    refusals = {
        "--- a/missing.py\n+++ b/missing.py\n@@ -1 +1 @@\n-a\n+b\n": "not in the repository",
        "--- /dev/null\n+++ b/README.md\n@@ -0,0 +1 @@\n+x\n": "exists",
        "--- a/README.md\n+++ b/src/calc.py\n@@ -1 +1 @@\n-calc\n+x\n": "renames onto",
        "--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1 +1 @@\n-nope\n+x\n": "does not match",
        "--- /dev/null\n+++ b/tests/test_calc.py\n@@ -0,0 +1 @@\n+x\n": "test file",
        "--- a/src/calc.py\n+++ b/src/../../calc.py\n@@ -1 +1 @@\n-def add(a, b):\n+x\n": "inside",
    }
    for text, message in refusals.items():
        with pytest.raises(PatchRejected, match=message):
            apply_to_repo(REPO, parse_patch(text), frozenset())
    with_tests = apply_to_repo(
        REPO, parse_patch("--- /dev/null\n+++ b/tests/t.py\n@@ -0,0 +1 @@\n+x\n"), frozenset(), tests_too=True
    )
    assert with_tests["tests/t.py"] == "x\n"


@needs_bwrap
def test_execution_runs_the_tests() -> None:
    domain = SweDomain()
    rewrite = (
        "--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,3 @@\n-def add(a, b):\n-    return a - b\n"
        "+def add(x, y):\n+    total = x + y\n+    return total\n"
    )
    wrong = CALC_GOLD.replace("a + b", "a * b")
    readme_only = "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-calc\n+calc, fixed\n"
    verdicts = domain.score_batch([runnable()] * 4, [CALC_GOLD, rewrite, wrong, readme_only])
    assert [(v.reward, v.reason) for v in verdicts] == [
        (1.0, OK),
        (1.0, OK),
        (0.0, WRONG_ANSWER),
        (0.0, WRONG_ANSWER),
    ]
    assert "all 2 tests pass" in verdicts[0].detail and "add(2, 3)" in verdicts[2].detail
    # A check that raises, a syntax error the patch introduces, unparsable and no-op patches.
    broken = CALC_GOLD.replace("a + b", "a +")
    assert domain.score(runnable(), broken).reason in (WRONG_ANSWER, "runtime_error")
    assert domain.score(runnable(), broken).reward == 0.0
    assert (domain.score(runnable(), "junk").reward, domain.score(runnable(), "").reason) == (-1.0, NO_CHANGE)


@needs_bwrap
def test_execution_of_test_functions() -> None:
    test_file = (
        "import unittest\nfrom src.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "class TestAdd(unittest.TestCase):\n    def test_zero(self):\n"
        "        self.assertEqual(add(0, 0), 0)\n"
        "    def test_neg(self):\n        self.assertEqual(add(-1, -1), -2)\n\n\n"
        "class Plain:\n    def test_one(self):\n        assert add(1, 0) == 1\n"
    )
    repo = {**REPO, "tests/test_calc.py": test_file}
    ids = [
        "tests/test_calc.py::test_add",
        "tests/test_calc.py::TestAdd::test_neg",
        "tests/test_calc.py::Plain::test_one",
    ]
    prob = runnable([{"test": i} for i in ids], repo)
    domain = SweDomain()
    assert [
        (v.reward, v.reason)
        for v in domain.score_batch([prob, prob], [CALC_GOLD, CALC_GOLD.replace("a + b", "a * b")])
    ] == [
        (1.0, OK),
        (0.0, WRONG_ANSWER),
    ]
    assert (
        domain.score(
            prob,
            "--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -6 +6 @@\n"
            "-    assert add(2, 3) == 5\n+    pass\n",
        ).reason
        == WRONG_ANSWER
    )


def test_extraction_is_linear_on_hostile_fences() -> None:
    """The fence pattern was quadratic: one 48,000-character completion held the GIL for seconds."""
    domain = SweDomain(mode="similarity")
    for text in ("```" + "a" * 48_000, "```a" * 12_000, "```" * 16_000, "```diff " + "+" * 48_000):
        start = time.perf_counter()
        verdict = domain.score(problem(), text)
        assert time.perf_counter() - start < 1.0, text[:20]
        assert verdict.reason in (PARSE_ERROR, NO_CHANGE, OUTPUT_LIMIT)
    over = SweDomain(max_completion_chars=1000).score(problem(), "x" * 1001)
    assert (over.reward, over.reason) == (-1.0, OUTPUT_LIMIT) and "cap 1000" in over.detail


def test_fenced_blocks() -> None:
    assert fenced_blocks("a ```diff x\nbody\n``` b ```\nsecond") == [("diff", "body\n"), ("", "second")]
    assert fenced_blocks("``` no newline") == [] and fenced_blocks("```Patch\n") == [("patch", "")]


# --------------------------------------------------------------------------- adapter rows


def swe_row(**extra: Any) -> dict[str, Any]:
    return {
        "instance_id": "acme__calc-9",
        "repo": "acme/calc",
        "problem_statement": "add() subtracts.",
        "patch": CALC_GOLD,
        "files": [{"path": p, "content": c} for p, c in REPO.items()],
        **extra,
    }


TEST_PATCH = (
    "--- /dev/null\n+++ b/tests/test_calc.py\n@@ -0,0 +1,4 @@\n"
    "+from src.calc import add\n+\n+def test_add():\n+    assert add(2, 3) == 5\n"
)


def convert(row: dict[str, Any]) -> Any:
    source = HfPrompts(path="x", adapter="swe", files_column="files")
    return ADAPTERS["swe"].convert(row, source)


def test_adapter_rows_with_runnable_tests_carry_them() -> None:
    row = swe_row(test_patch=TEST_PATCH, FAIL_TO_PASS='["tests/test_calc.py::test_add"]', PASS_TO_PASS=[])
    meta = convert(row).meta
    assert meta["repo"] == "acme/calc" and meta["swe_tests"] == [{"test": "tests/test_calc.py::test_add"}]
    assert set(meta["repo_files"]) == {"src/calc.py", "README.md", "tests/test_calc.py"}
    for unrunnable in (
        swe_row(test_patch=TEST_PATCH, FAIL_TO_PASS='["test_add (calc.tests.AddTest)"]'),  # Django style
        swe_row(test_patch=TEST_PATCH, FAIL_TO_PASS='["tests/test_calc.py::test_add[1-2]"]'),  # parametrised
        swe_row(FAIL_TO_PASS='["tests/test_calc.py::test_add"]'),  # the test file is not there
        swe_row(test_patch=TEST_PATCH),  # no test ids
        swe_row(test_patch="not a diff", FAIL_TO_PASS='["tests/test_calc.py::test_add"]'),
        swe_row(test_patch=TEST_PATCH, FAIL_TO_PASS="not json"),
        {**swe_row(test_patch=TEST_PATCH, FAIL_TO_PASS='["tests/test_calc.py::test_add"]'), "files": []},
    ):
        converted = convert(unrunnable).meta
        assert "swe_tests" not in converted and "repo_files" not in converted


@needs_bwrap
def test_adapter_row_runs_under_the_execution_reward() -> None:
    converted = convert(swe_row(test_patch=TEST_PATCH, FAIL_TO_PASS=["tests/test_calc.py::test_add"]))
    prob = Problem("row", "swe", converted.prompt, converted.answer, converted.meta)
    verdicts = SweDomain().score_batch([prob, prob], [CALC_GOLD, CALC_GOLD.replace("a + b", "b - a")])
    assert [(v.reward, v.reason) for v in verdicts] == [(1.0, OK), (0.0, WRONG_ANSWER)]


# --------------------------------------------------------------------------- reward service routing


def test_reward_service_sends_executing_swe_to_the_workers() -> None:
    """Heavy swe goes to Celery (here: no app, so the queue is 'unavailable'); light swe stays local."""
    from services.reward.batch import Batch
    from services.reward.scoring import DispatchConfig, Dispatcher

    class Local:
        """Records that the front's own scoring was asked (whatever its method)."""

        def __init__(self) -> None:
            self.asked = 0

        def __getattr__(self, name: str) -> Any:
            def method(*args: Any, **kwargs: Any) -> Any:
                self.asked += 1
                return iter(())

            return method

    def route(reward: SweReward | None, config: DispatchConfig) -> str:
        local = Local()
        (verdict,) = Dispatcher(config, None, local).score(  # type: ignore[arg-type]
            Batch(DomainConfig(name="swe", reward=reward), [problem()], [GOLD])
        )
        if "reward queue unavailable" in verdict.detail:
            return "workers"
        return "front" if local.asked else "?"

    default = DispatchConfig(remote_domains=frozenset())
    judged = SweReward(mode="exact_or_judge", judge_model_path=Path("j"))
    assert [route(r, default) for r in (None, SweReward(), judged)] == ["workers"] * 3
    light = [SweReward(mode="similarity"), SweReward(mode="exact_or_judge")]
    assert [route(r, default) for r in light] == ["front"] * 2
    never = DispatchConfig(remote_domains=frozenset(), remote_when_heavy=frozenset())
    assert route(SweReward(), never) == "front"
    assert route(SweReward(mode="similarity"), DispatchConfig(remote_domains=frozenset({"swe"}))) == "workers"


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


def _values(source: str, checks: list[dict[str, Any]]) -> list[Any]:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    out = []
    for check in checks:
        try:
            out.append(json.loads(json.dumps(eval(check["expr"], namespace))))
        except Exception as err:
            out.append(repr(err))
    return out


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
        # The execution reward's repository and value checks: the fixed file's values, which the
        # buggy one does not all give.
        assert p.meta["repo_files"] == {path: p.meta["source"]}
        checks = p.meta["swe_tests"]
        assert [c["expr"] for c in checks] == [re.split(" (?:==|is) ", t)[0] for t in p.meta["tests"]]
        assert {c["module"] for c in checks} == {path.removesuffix(".py").replace("/", ".")}
        assert _values(p.meta["fixed"], checks) == [c["output"] for c in checks]
        assert _values(p.meta["source"], checks) != [c["output"] for c in checks], p.id
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


def test_reward_service_runs_swe_only_in_bubblewrap() -> None:
    from cascade_proto.v1 import reward_pb2 as pb
    from services.reward.requests import BadRequest, parse_request

    def request(reward: str) -> pb.ScoreRequest:
        item = pb.Item(problem=pb.Problem(id="p", prompt="q", answer=GOLD), completion=GOLD)
        return pb.ScoreRequest(domain="swe", reward_config_json=reward, items=[item])

    with pytest.raises(BadRequest, match="'process' is not a sandbox"):
        parse_request(request('{"sandbox": "process"}'), max_items=8)
    batch = parse_request(request('{"sandbox": "auto"}'), max_items=8)
    assert isinstance(batch.domain.reward, SweReward) and batch.domain.reward.sandbox == "bwrap"

"""Software-engineering domain ("swe"): fix a bug by writing a patch.

The reward (`SweReward.mode`, see `cascade.config`) is, by default, execution-based: the patch
is applied to the problem's repository and its tests run in the code sandbox
(`cascade.domains.swe_exec`). Scoring one completion (`SweDomain.score_batch`):

1. Over `max_completion_chars` -> -1.0, `output_limit` (before any pattern is matched).
2. The patch is extracted (`extract_patch`, linear time): the ```diff / ```patch fenced blocks
   of the response (thinking removed), joined; else other fenced blocks that look like a diff;
   else the raw response from its first `diff --git` or `--- ` line.
3. Blank patch -> 0.0, `no_change`.
4. Over the caps -> -1.0, `output_limit`: more than `max_patch_chars` characters (checked before
   parsing) or more than `max_changed_lines` removed+added lines (after parsing).
5. Not a unified diff (`cascade.domains.patches.PatchParseError`) -> -1.0, `parse_error`.
6. Changes nothing (only context lines, only blank lines, or re-adds what it removes) -> 0.0,
   `no_change`.
7. Then, by mode:
   - `execution`, on a problem with a repository and tests (`swe_exec.has_tests`): the patch is
     applied (`swe_exec.apply_to_repo`). Refused (does not apply, edits a test file, a path
     outside the repository) -> 0.0, `wrong_answer`; files unchanged -> 0.0, `no_change`; else
     the tests run in the sandbox: all pass -> 1.0, `ok`; else 0.0 with the sandbox's reason
     (`wrong_answer`, `runtime_error`, `timeout`, ...). A problem without tests goes on as
     `exact_or_judge`.
   - `exact_or_judge`: equal to the gold patch after whitespace normalisation (same files, same
     changed lines; context and positions ignored) -> 1.0, `ok`; else the judge's probability
     (`swe_judge.PatchJudge`) -> that reward (`ok` when above 0, else `wrong_answer`); without a
     judge -> 0.0, `wrong_answer`.
   - `similarity` (opt-in, known to be gameable: see `SweReward`): exact -> 1.0; else
     `patches.lexical_similarity` (file-set Jaccard and token SequenceMatcher ratio), blended
     with a `semantic_scorer` as `(1 - w) * lexical + w * clamp(semantic, 0, 1)`; 0 ->
     `wrong_answer`, else that reward, `ok`, the detail starting with "partial credit".

A gold patch that does not parse or changes nothing is the problem's fault: `infra_error`, as is
a judge or semantic scorer that raises, and the sandbox's own failures.

Problems (`make_problems`) are small synthetic Python files with one buggy function (off-by-one,
wrong operator, wrong comparison or wrong return value; the docstring states the intended
behaviour); the reference answer is the fix as a unified diff (3 context lines, `a/`/`b/`
prefixes). Meta keeps the path, bug kind, function, buggy and fixed file, assertions the fixed
function passes and the buggy one fails (`tests`), and for the execution reward the repository
(`repo_files`: the buggy file) and those assertions as value checks (`swe_tests`: the call, and the
fixed code's value, which the sandbox's judge compares).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from random import Random
from typing import Any, Literal, Protocol, runtime_checkable

from cascade.config import SweReward
from cascade.domains.base import (
    INFRA_ERROR,
    OK,
    OUTPUT_LIMIT,
    PARSE_ERROR,
    WRONG_ANSWER,
    Problem,
    RewardVerdict,
)
from cascade.domains.common import Candidate, LruCache, generate_problems
from cascade.domains.patches import (
    Patch,
    PatchParseError,
    file_overlap_and_content,
    lexical_similarity,
    parse_patch,
    patches_equal,
)
from cascade.domains.swe_exec import (
    PatchRejected,
    apply_to_repo,
    has_tests,
    module_of,
    sandbox_job,
    test_files,
)
from cascade.domains.swe_judge import JudgeInputTooLong, PatchJudge
from cascade.model.chat import strip_thinking
from cascade.sandbox.jobs import BwrapSettings, ExecResult, Job, SandboxLimits, resolve_backend, run_jobs

NO_CHANGE = "no_change"
"""Reason of a patch that changes nothing (blank, only context, or removes and re-adds the same lines)."""

SweMode = Literal["execution", "exact_or_judge", "similarity"]
MODES: tuple[SweMode, ...] = ("execution", "exact_or_judge", "similarity")
DEFAULT_MAX_PATCH_CHARS = 20_000
DEFAULT_MAX_CHANGED_LINES = 400
DEFAULT_MAX_COMPLETION_CHARS = 200_000
DEFAULT_SEMANTIC_WEIGHT = 0.5


# --------------------------------------------------------------------------- scorers


@runtime_checkable
class SemanticScorer(Protocol):
    """A similarity of two patch texts in [0, 1] (`similarity` mode only)."""

    def similarity(self, pred: str, gold: str) -> float: ...


class LexicalScorer:
    """`patches.lexical_similarity` of two patch texts (raises PatchParseError on a malformed one)."""

    def similarity(self, pred: str, gold: str) -> float:
        return lexical_similarity(parse_patch(pred), parse_patch(gold))


# --------------------------------------------------------------------------- extraction

_FENCE = "```"
_LANG = re.compile(r"[ \t]*([\w+-]*)")
_DIFF_LANGS = {"diff", "patch", "udiff"}
_DIFF_START = re.compile(r"^(?:diff --git |--- )", re.MULTILINE)
_LOOKS_LIKE_DIFF = re.compile(r"^(?:diff --git |--- |\+\+\+ |@@ )", re.MULTILINE)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each ``` fenced block, in linear time.

    A fence opens at a ``` followed, on the same line, by an optional language word and then
    anything up to the newline; its body runs to the next ``` (or the end of the text).
    """
    blocks: list[tuple[str, str]] = []
    at = 0
    while True:
        start = text.find(_FENCE, at)
        if start < 0:
            return blocks
        eol = text.find("\n", start + len(_FENCE))
        if eol < 0:  # no later fence can have a body either
            return blocks
        match = _LANG.match(text, start + len(_FENCE), eol)
        lang = match.group(1) if match else ""
        end = text.find(_FENCE, eol + 1)
        blocks.append((lang.lower(), text[eol + 1 : end if end >= 0 else len(text)]))
        if end < 0:
            return blocks
        at = end + len(_FENCE)


def extract_patch(completion: str) -> str:
    """The patch in a completion (see the module docstring, step 2); "" when the response is blank."""
    response = strip_thinking(completion)
    blocks = fenced_blocks(response)
    chosen = [body for lang, body in blocks if lang in _DIFF_LANGS]
    if not chosen:
        chosen = [body for _, body in blocks if _LOOKS_LIKE_DIFF.search(body)]
    if chosen:
        return "\n".join(body.strip("\n") for body in chosen).strip("\n")
    start = _DIFF_START.search(response)
    return (response[start.start() :] if start else response).strip("\n")


# --------------------------------------------------------------------------- domain


@dataclass(frozen=True)
class _Parsed:
    """A completion that passed the common checks (steps 1-6)."""

    text: str
    patch: Patch
    gold: Patch


class SweDomain:
    """The swe domain: synthetic bug-fix problems plus the patch reward (module docstring)."""

    name = "swe"

    def __init__(
        self,
        *,
        mode: SweMode = "execution",
        max_patch_chars: int = DEFAULT_MAX_PATCH_CHARS,
        max_changed_lines: int = DEFAULT_MAX_CHANGED_LINES,
        max_completion_chars: int = DEFAULT_MAX_COMPLETION_CHARS,
        semantic_scorer: SemanticScorer | None = None,
        semantic_weight: float = DEFAULT_SEMANTIC_WEIGHT,
        judge: PatchJudge | None = None,
        limits: SandboxLimits | None = None,
        sandbox: Literal["auto", "bwrap", "process"] = "auto",
        settings: BwrapSettings | None = None,
        workers: int = 2,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if max_patch_chars < 1 or max_changed_lines < 1 or max_completion_chars < 1:
            raise ValueError(
                f"caps must be >= 1, got {max_patch_chars} chars, {max_changed_lines} lines, "
                f"{max_completion_chars} completion chars"
            )
        if not 0.0 <= semantic_weight <= 1.0:
            raise ValueError(f"semantic_weight must be in [0, 1], got {semantic_weight}")
        if semantic_scorer is not None and mode != "similarity":
            raise ValueError(f"a semantic_scorer is used only by mode 'similarity' (mode is {mode!r})")
        if judge is not None and mode == "similarity":
            raise ValueError("a judge is used only by modes 'exact_or_judge' and 'execution'")
        self.mode: SweMode = mode
        self.max_patch_chars = max_patch_chars
        self.max_changed_lines = max_changed_lines
        self.max_completion_chars = max_completion_chars
        self.semantic_scorer = semantic_scorer
        self.semantic_weight = semantic_weight
        self.judge = judge
        self.limits = limits or SandboxLimits(time_limit_s=5.0)
        self.sandbox: Literal["auto", "bwrap", "process"] = sandbox
        self.settings = settings or BwrapSettings()
        self.workers = workers
        self.lexical_scorer = LexicalScorer()
        self.config: SweReward | None = None
        """The settings it was built from (`from_config`), else None."""
        self._gold_cache: LruCache[str, Patch] = LruCache(4096)

    @classmethod
    def from_config(
        cls,
        config: SweReward,
        semantic_scorer: SemanticScorer | None = None,
        judge: PatchJudge | None = None,
    ) -> SweDomain:
        """The domain of a `SweReward`; its `judge_model_path` loads an `HfPatchJudge` (unless `judge`)."""
        if judge is None and config.judge_model_path is not None:
            from cascade.domains.swe_judge import HfPatchJudge

            judge = HfPatchJudge(
                config.judge_model_path, device=config.judge_device, max_length=config.judge_max_length
            )
        domain = cls(
            mode=config.mode,
            max_patch_chars=config.max_patch_chars,
            max_changed_lines=config.max_changed_lines,
            max_completion_chars=config.max_completion_chars,
            semantic_scorer=semantic_scorer,
            semantic_weight=config.semantic_weight,
            judge=judge,
            limits=SandboxLimits(time_limit_s=config.time_limit_s, memory_mb=config.memory_mb),
            sandbox=config.sandbox,
            settings=BwrapSettings(uid=config.sandbox_uid),
        )
        domain.config = config
        return domain

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return generate_problems(self.name, split, n, seed, draw_swe_problem)

    def prepare(self) -> None:
        """Start the sandbox now when the reward executes (`SandboxUnavailable` saying what the
        host lacks; `sandbox: process` gets its one warning instead)."""
        if self.mode == "execution":
            resolve_backend(self.sandbox, self.workers, self.settings)

    def score(self, problem: Problem, completion: str) -> RewardVerdict:
        return self.score_batch([problem], [completion])[0]

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        verdicts: list[RewardVerdict | None] = [None] * len(problems)
        jobs: list[Job] = []
        slots: list[int] = []
        for i, (problem, completion) in enumerate(zip(problems, completions, strict=True)):
            parsed = self._parse(problem, completion)
            if isinstance(parsed, RewardVerdict):
                verdicts[i] = parsed
            elif self.mode == "execution" and has_tests(problem.meta):
                job = self._job(problem, parsed)
                if isinstance(job, RewardVerdict):
                    verdicts[i] = job
                else:
                    jobs.append(job)
                    slots.append(i)
            elif self.mode == "similarity":
                verdicts[i] = self._similarity(problem, parsed)
            else:
                verdicts[i] = self._exact_or_judge(problem, parsed)
        if jobs:
            results = run_jobs(
                jobs, self.limits, workers=self.workers, backend=self.sandbox, settings=self.settings
            )
            for i, result in zip(slots, results, strict=True):
                verdicts[i] = _execution_verdict(result)
        return [v if v is not None else RewardVerdict(0.0, INFRA_ERROR, "not scored") for v in verdicts]

    # ------------------------------------------------------------------ steps

    def _parse(self, problem: Problem, completion: str) -> _Parsed | RewardVerdict:
        """Steps 1-6 of the module docstring: a verdict, or the parsed patch to judge."""
        if len(completion) > self.max_completion_chars:
            return RewardVerdict(
                -1.0,
                OUTPUT_LIMIT,
                f"completion has {len(completion)} characters (cap {self.max_completion_chars})",
            )
        patch_text = extract_patch(completion)
        if not patch_text.strip():
            return RewardVerdict(0.0, NO_CHANGE, "empty patch")
        if len(patch_text) > self.max_patch_chars:
            return RewardVerdict(
                -1.0, OUTPUT_LIMIT, f"patch has {len(patch_text)} characters (cap {self.max_patch_chars})"
            )
        gold = self._gold(problem)
        if isinstance(gold, str):
            return RewardVerdict(0.0, INFRA_ERROR, gold)
        try:
            pred = parse_patch(patch_text)
        except PatchParseError as err:
            return RewardVerdict(-1.0, PARSE_ERROR, str(err))
        if pred.changed_line_count > self.max_changed_lines:
            return RewardVerdict(
                -1.0,
                OUTPUT_LIMIT,
                f"patch changes {pred.changed_line_count} lines (cap {self.max_changed_lines})",
            )
        if pred.is_noop:
            return RewardVerdict(0.0, NO_CHANGE, "the patch changes nothing")
        return _Parsed(patch_text, pred, gold)

    def _job(self, problem: Problem, parsed: _Parsed) -> Job | RewardVerdict:
        repo: dict[str, str] = problem.meta["repo_files"]
        tests: list[dict[str, Any]] = problem.meta["swe_tests"]
        try:
            files = apply_to_repo(repo, parsed.patch, test_files(tests))
        except PatchRejected as err:
            return RewardVerdict(0.0, WRONG_ANSWER, f"patch rejected: {err}")
        if files == repo:
            return RewardVerdict(0.0, NO_CHANGE, "the patch leaves the repository as it was")
        return sandbox_job(files, tests)

    def _exact_or_judge(self, problem: Problem, parsed: _Parsed) -> RewardVerdict:
        if patches_equal(parsed.patch, parsed.gold):
            return RewardVerdict(1.0, OK, "exact match")
        if self.judge is None:
            return RewardVerdict(0.0, WRONG_ANSWER, "not the gold patch (no judge configured)")
        try:
            p = float(self.judge.judge(problem.prompt, problem.answer, parsed.text))
        except JudgeInputTooLong as err:
            return RewardVerdict(0.0, WRONG_ANSWER, f"patch too long for the judge: {err}")
        except Exception as err:  # a broken judge must not become a reward
            return RewardVerdict(0.0, INFRA_ERROR, f"judge failed: {err!r:.200}")
        if not 0.0 <= p <= 1.0:  # also NaN
            return RewardVerdict(0.0, INFRA_ERROR, f"judge returned {p!r}, not a probability")
        if p <= 0.0:
            return RewardVerdict(0.0, WRONG_ANSWER, "judge: P(fixes the issue) = 0")
        return RewardVerdict(p, OK, f"judge: P(fixes the issue) = {p:.3f}")

    def _similarity(self, problem: Problem, parsed: _Parsed) -> RewardVerdict:
        if patches_equal(parsed.patch, parsed.gold):
            return RewardVerdict(1.0, OK, "exact match")
        files, content = file_overlap_and_content(parsed.patch, parsed.gold)
        lexical = (files + content) / 2
        detail = f"lexical {lexical:.3f} (file overlap {files:.3f}, changed lines {content:.3f})"
        score = lexical
        if self.semantic_scorer is not None:
            try:
                semantic = float(self.semantic_scorer.similarity(parsed.text, problem.answer))
            except Exception as err:  # a broken scorer must not become a reward
                return RewardVerdict(0.0, INFRA_ERROR, f"semantic scorer failed: {err!r:.200}")
            semantic = min(max(semantic, 0.0), 1.0)
            w = self.semantic_weight
            score = (1.0 - w) * lexical + w * semantic
            detail += f", semantic {semantic:.3f}, weight {w:g}"
        if score <= 0.0:
            return RewardVerdict(0.0, WRONG_ANSWER, "no similarity to the gold patch: " + detail)
        return RewardVerdict(min(score, 1.0), OK, f"partial credit {min(score, 1.0):.3f}: " + detail)

    def _gold(self, problem: Problem) -> Patch | str:
        """The parsed gold patch, or a message saying why it is unusable."""
        cached = self._gold_cache.get(problem.answer)
        if cached is not None:
            return cached
        try:
            gold = parse_patch(problem.answer)
        except PatchParseError as err:
            return f"problem {problem.id}: gold patch does not parse: {err}"
        if gold.is_noop:
            return f"problem {problem.id}: gold patch changes nothing"
        self._gold_cache.put(problem.answer, gold)
        return gold


def _execution_verdict(result: ExecResult) -> RewardVerdict:
    """A sandbox result as the reward: 1 when every test passed, else 0 (the sandbox's reason)."""
    if result.status == INFRA_ERROR:
        return RewardVerdict(0.0, INFRA_ERROR, result.detail)
    if result.status == OK:
        return RewardVerdict(1.0, OK, f"all {result.total} tests pass")
    # The driver is ours and compiles; a `parse_error` here is the patched code's doing.
    reason = WRONG_ANSWER if result.status == PARSE_ERROR else result.status
    return RewardVerdict(0.0, reason, f"{result.passed}/{result.total} tests passed; {result.detail}")


# --------------------------------------------------------------------------- synthetic problems


@dataclass(frozen=True)
class BugTemplate:
    """A function with one buggy spot: `code` with `{line}` where `buggy` / `fixed` goes.

    `code`, `buggy`, `fixed` and `tests` may use `{f}` (function name), `{xs}` (list argument)
    and `{k}` (a constant from `ks`). Each test is `<call> == <value>` or `<call> is <value>`
    (`value_checks`); together they must reject at least 95% of the mechanical mutants of the
    fixed function, for every `k` (`tests/unit/test_swe_mutants.py`).
    """

    kind: str
    names: tuple[str, ...]
    code: str
    buggy: str
    fixed: str
    tests: tuple[str, ...]
    ks: tuple[int, ...] = (0,)


BUG_KINDS = ("off_by_one", "wrong_operator", "wrong_comparison", "wrong_return")

TEMPLATES: tuple[BugTemplate, ...] = (
    BugTemplate(
        "off_by_one",
        ("sum_to", "triangle", "sum_upto"),
        'def {f}(n):\n    """Return 1 + 2 + ... + n."""\n    total = 0\n'
        "    for i in range(1, {line}):\n        total += i\n    return total\n",
        "n",
        "n + 1",
        ("{f}(3) == 6", "{f}(1) == 1", "{f}(0) == 0", "{f}(10) == 55"),
    ),
    BugTemplate(
        "off_by_one",
        ("last", "last_item", "tail_value"),
        'def {f}({xs}):\n    """Return the last element of the non-empty list {xs}."""\n'
        "    return {xs}[{line}]\n",
        "len({xs})",
        "len({xs}) - 1",
        ("{f}([4, 5, 6]) == 6", "{f}([7]) == 7", "{f}([2, 9, 1, 3]) == 3"),
    ),
    BugTemplate(
        "off_by_one",
        ("count_below", "count_smaller", "num_below"),
        'def {f}({xs}, limit):\n    """Return how many items of {xs} are smaller than limit."""\n'
        "    count = 0\n    for i in range({line}):\n        if {xs}[i] < limit:\n"
        "            count += 1\n    return count\n",
        "len({xs}) - 1",
        "len({xs})",
        (
            "{f}([1, 5, 2], 3) == 2",
            "{f}([1, 2], 9) == 2",
            "{f}([3, 1, 3, 4], 3) == 1",
            "{f}([-4, 0, 7], 0) == 1",
            "{f}([], 5) == 0",
        ),
    ),
    BugTemplate(
        "off_by_one",
        ("first_n", "head", "take"),
        'def {f}({xs}, n):\n    """Return a list of the first n items of {xs}."""\n'
        "    return {xs}[:{line}]\n",
        "n - 1",
        "n",
        ("{f}([1, 2, 3], 2) == [1, 2]", "{f}([4, 5, 6], 3) == [4, 5, 6]", "{f}([7, 8], 0) == []"),
    ),
    BugTemplate(
        "wrong_operator",
        ("add", "plus", "total_of"),
        'def {f}(a, b):\n    """Return the sum of a and b."""\n    return {line}\n',
        "a - b",
        "a + b",
        ("{f}(2, 3) == 5", "{f}(-4, 10) == 6", "{f}(7, 0) == 7"),
    ),
    BugTemplate(
        "wrong_operator",
        ("mean", "average", "avg"),
        'def {f}({xs}):\n    """Return the arithmetic mean of the non-empty list {xs}."""\n'
        "    return sum({xs}) {line} len({xs})\n",
        "*",
        "/",
        ("{f}([2, 4]) == 3", "{f}([1, 2]) == 1.5", "{f}([-7, 2]) == -2.5", "{f}([5]) == 5"),
    ),
    BugTemplate(
        "wrong_operator",
        ("area", "rect_area", "surface"),
        'def {f}(width, height):\n    """Return the area of a width by height rectangle."""\n'
        "    return width {line} height\n",
        "+",
        "*",
        ("{f}(3, 4) == 12", "{f}(2, 7) == 14", "{f}(5, 0) == 0", "{f}(1, 6) == 6"),
    ),
    BugTemplate(
        "wrong_operator",
        ("scale", "times_k", "multiply"),
        'def {f}(x):\n    """Return x multiplied by {k}."""\n    return x {line} {k}\n',
        "+",
        "*",
        ("{f}(5) == 5 * {k}", "{f}(-3) == -3 * {k}", "{f}(0) == 0", "{f}(1) == {k}"),
        ks=tuple(range(2, 10)),
    ),
    BugTemplate(
        "wrong_comparison",
        ("largest", "maximum", "biggest"),
        'def {f}({xs}):\n    """Return the largest item of the non-empty list {xs}."""\n'
        "    best = {xs}[0]\n    for x in {xs}:\n        if x {line} best:\n            best = x\n"
        "    return best\n",
        "<",
        ">",
        ("{f}([3, 9, 2]) == 9", "{f}([5]) == 5", "{f}([-4, -1, -7]) == -1", "{f}([8, 3, 8]) == 8"),
    ),
    BugTemplate(
        "wrong_comparison",
        ("is_adult", "old_enough", "may_vote"),
        'def {f}(age):\n    """Return True if age is at least {k}."""\n    return age {line} {k}\n',
        ">",
        ">=",
        ("{f}({k}) is True", "{f}({k} - 1) is False", "{f}({k} + 1) is True", "{f}(0) is False"),
        ks=tuple(range(16, 22)),
    ),
    BugTemplate(
        "wrong_comparison",
        ("in_range", "between", "within"),
        'def {f}(x, low, high):\n    """Return True if low <= x <= high."""\n'
        "    return low <= x {line} high\n",
        "<",
        "<=",
        (
            "{f}(5, 1, 5) is True",
            "{f}(6, 1, 5) is False",
            "{f}(1, 1, 5) is True",
            "{f}(0, 1, 5) is False",
            "{f}(3, 1, 5) is True",
            "{f}(-2, -3, -1) is True",
        ),
    ),
    BugTemplate(
        "wrong_comparison",
        ("is_even", "even", "has_even_value"),
        'def {f}(x):\n    """Return True if x is even."""\n    return x % 2 {line} 0\n',
        "!=",
        "==",
        ("{f}(4) is True", "{f}(3) is False", "{f}(0) is True", "{f}(-7) is False", "{f}(-6) is True"),
    ),
    BugTemplate(
        "wrong_return",
        ("count_positive", "num_positive", "positives"),
        'def {f}({xs}):\n    """Return how many items of {xs} are greater than zero."""\n'
        "    count = 0\n    for x in {xs}:\n        if x > 0:\n            count += 1\n    return {line}\n",
        "x",
        "count",
        ("{f}([1, -2, 3]) == 2", "{f}([5, 0]) == 1", "{f}([]) == 0", "{f}([-1, -2]) == 0"),
    ),
    BugTemplate(
        "wrong_return",
        ("index_of", "find", "position"),
        'def {f}({xs}, target):\n    """Return the index of target in {xs}, or -1 if it is absent."""\n'
        "    for i, x in enumerate({xs}):\n        if x == target:\n"
        "            return {line}\n    return -1\n",
        "x",
        "i",
        ("{f}([7, 8, 9], 9) == 2", "{f}([7], 5) == -1", "{f}([4, 6, 4], 4) == 0", "{f}([9, 8], 8) == 1"),
    ),
    BugTemplate(
        "wrong_return",
        ("clamp", "bound", "limit_to"),
        'def {f}(x, low, high):\n    """Return x clamped into the range [low, high]."""\n'
        "    if x < low:\n        return low\n    if x > high:\n        return high\n    return {line}\n",
        "low",
        "x",
        (
            "{f}(5, 0, 10) == 5",
            "{f}(-1, 0, 10) == 0",
            "{f}(15, 0, 10) == 10",
            "{f}(10, 0, 10) == 10",
            "{f}(0, 0, 10) == 0",
            "{f}(-5, -8, -2) == -5",
        ),
    ),
    BugTemplate(
        "wrong_return",
        ("absolute", "abs_value", "magnitude"),
        'def {f}(x):\n    """Return the absolute value of x."""\n'
        "    if x < 0:\n        return {line}\n    return x\n",
        "x",
        "-x",
        ("{f}(-3) == 3", "{f}(2) == 2", "{f}(-1) == 1", "{f}(0) == 0"),
    ),
)

LIST_NAMES = ("xs", "items", "values", "nums")
PATHS = ("src/util.py", "src/helpers.py", "src/mathutils.py", "lib/core.py", "app/tools.py")
HEADERS = ("", '"""Small helper functions."""', "from __future__ import annotations")
HELPERS = (
    'def double(x):\n    """Return twice x."""\n    return 2 * x\n',
    'def is_empty(xs):\n    """Return True if xs has no items."""\n    return len(xs) == 0\n',
    'def square(x):\n    """Return x squared."""\n    return x * x\n',
    'def negate(x):\n    """Return -x."""\n    return -x\n',
    'def first(xs):\n    """Return the first item of the non-empty list xs."""\n    return xs[0]\n',
    'def halve(x):\n    """Return x divided by 2."""\n    return x / 2\n',
)
"""Correct neighbour functions placed around the buggy one (their names are not bug names)."""


def unified_diff(old: str, new: str, path: str) -> str:
    """`diff -u` of two versions of `path` with `a/` and `b/` prefixes and 3 context lines."""
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=f"a/{path}", tofile=f"b/{path}", lineterm=""
    )
    return "\n".join(lines) + "\n"


def draw_swe_problem(rng: Random) -> Candidate:
    template = rng.choice(TEMPLATES)
    params = {
        "f": rng.choice(template.names),
        "xs": rng.choice(LIST_NAMES),
        "k": str(rng.choice(template.ks)),
    }
    path = rng.choice(PATHS)
    header = rng.choice(HEADERS)
    before = rng.sample(HELPERS, rng.randint(0, 2))
    after = rng.sample([h for h in HELPERS if h not in before], rng.randint(0, 1))

    def render(line: str) -> str:
        function = template.code.replace("{line}", line).format(**params)
        parts = ([header] if header else []) + before + [function] + after
        return "\n\n\n".join(part.rstrip("\n") for part in parts) + "\n"

    buggy = render(template.buggy.format(**params))
    fixed = render(template.fixed.format(**params))
    answer = unified_diff(buggy, fixed, path)
    tests = [test.format(**params) for test in template.tests]
    prompt = (
        f"The function `{params['f']}` in {path} has a bug: it does not do what its docstring says.\n\n"
        f"{path}:\n```python\n{buggy}```\n\n"
        f"Reply with a unified diff that fixes it (--- a/{path}, +++ b/{path}, then @@ hunks)."
    )
    meta = {
        "path": path,
        "bug": template.kind,
        "function": params["f"],
        "source": buggy,
        "fixed": fixed,
        "tests": tests,
        "repo_files": {path: buggy},
        "swe_tests": value_checks(fixed, module_of(path), tests),
    }
    return prompt, answer, meta


def value_checks(fixed: str, module: str, tests: Sequence[str]) -> list[dict[str, Any]]:
    """The execution reward's checks of assertions `<call> == <value>` / `<call> is <value>`:
    each call with the value the fixed source gives (run here: it is our own generated code)."""
    namespace: dict[str, Any] = {}
    exec(compile(fixed, f"<fixed {module}>", "exec"), namespace)
    checks = []
    for test in tests:
        call = re.split(r" (?:==|is) ", test, maxsplit=1)[0]
        value = json.loads(json.dumps(eval(call, namespace)))
        checks.append({"module": module, "expr": call, "output": value})
    return checks

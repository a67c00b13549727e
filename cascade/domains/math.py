"""Math domain: 2-digit arithmetic and short word problems, scored by answer equivalence.

Scoring uses math-verify (`verify(gold, pred)`, gold first: it is asymmetric). Its own
timeouts use SIGALRM and only work in a process's main thread, so this module disables
them and bounds each parse+verify itself:

- in the main thread: an ITIMER_REAL deadline of `config.timeout_s` around parse+verify;
- in any other thread (the embedded learner's helper threads): the same check runs in a
  pool of worker processes (`worker_pool.WorkerPool`, started on first use; `workers` of
  them, by default one per core up to 4), where it is the main thread again, with an outer
  wall-clock timeout on top. A worker that overruns that is killed (reason `timeout`); a
  worker that dies is `infra_error` (the learner drops the sample instead of scoring it 0).

Gold answers are read as the math they are, whatever their form (`gold_latex`): a gold of
`3\\sqrt{2}` (LaTeX without delimiters, as in MATH/AIME/Olympiad answer keys) is parsed as
`$3\\sqrt{2}$`; bare math-verify would read only its first number, 3. Already delimited or
boxed golds are parsed as they are, a GSM8K solution by its `#### <answer>` line, and a plain
word (`Monday`) as `\\text{...}`. tests/data/math_answer_table.jsonl is the regression table.

The final answer is what follows the reasoning block (`strip_thinking`): an answer that only
appears inside `<think>...</think>` (or before a `</think>` whose `<think>` was in the prompt)
earns nothing. Several boxed answers are read as one set, which equals a single gold only if
every element does, so hedging (`\\boxed{1}...\\boxed{100}`) earns nothing.

Failures are attributed: anything the completion controls (its parse or comparison raising,
running past the deadline) is a verdict on the completion (`parse_error`, `timeout`), never
`infra_error`; a gold that cannot be parsed is the platform's (`infra_error`, logged).

Known math-verify quirks (see tests/unit/test_domain_math.py and the regression table):
- An unevaluated expression equals its value: `\\boxed{47+38}` (or just echoing "47+38" from
  the prompt) verifies against `85`. The final answer must therefore be a closed form, decided
  on its parsed tree, never its text (`math_closed_form`, whose docstring states the rule):
  `47+38`, `\\left(47+38\\right)`, `\\lim_{x\\to0}(47+38)`, `\\sum_{i=1}^{1}85` are `wrong_answer`;
  `85.0`, `\\frac{170}{2}`, `8.5\\times10^1`, `10^6`, `3\\sqrt{2}`, `--85` are forms of a number.
- Plain-text math is read as plain numbers: `the answer is 3\\sqrt{2}` and `3√2` as 3. We
  rewrite unicode math as LaTeX and delimit undelimited LaTeX runs first (`math_notation`).
- A percentage equals its number: `85%` verifies against `85`, and `10` against `10\\%`.
  Accepted (an answer key rarely distinguishes them).
- Units and degree signs are dropped (`5\\text{ cm}` = 5, `30^\\circ` = 30).
- With several numbers and no `\\boxed{}`, the last one is taken ("84 then 85" -> 85).
- Repeating decimals (`0.\\overline{3}`) are read as their integer part: we rewrite them as
  fractions first (`math_notation.normalise_notation`). An interval and the inequality that describes it
  (`[0,\\infty)`, `x \\ge 0`) are compared as sets (`allow_set_relation_comp`).
- Several boxed answers are one set (`answer_text`; math-verify alone does so only when they
  are adjacent): a self-correction that boxes both answers is wrong.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from random import Random
from typing import Any

from cascade.config import MathReward
from cascade.domains.base import (
    INFRA_ERROR,
    NO_ANSWER,
    OK,
    PARSE_ERROR,
    TIMEOUT,
    WRONG_ANSWER,
    Problem,
    RewardVerdict,
)
from cascade.domains.common import Candidate, LruCache, generate_problems
from cascade.domains.math_closed_form import not_closed_form
from cascade.domains.math_notation import delimit_inline_math, normalise_notation
from cascade.domains.worker_pool import Outcome, WorkerPool, default_size
from cascade.model.chat import strip_thinking

log = logging.getLogger(__name__)

_NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Eva", "Max", "Zoe", "Leo", "Ivy")
_ITEMS = ("apples", "pens", "cards", "books", "coins", "eggs", "cups", "toys")
_GAIN = ("buys {b} more", "finds {b} more", "gets {b} more")
_LOSS = ("gives away {b}", "loses {b}", "sells {b}")

Check = tuple[str, str]
"""(reason, detail) of one completion."""

WorkerTask = Callable[[str, str, float], Check]


def draw_math_problem(rng: Random) -> Candidate:
    """One candidate: ~70% "What is a+b?" / "What is a-b?", ~30% a one-step word problem."""
    if rng.random() < 0.7:
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        if rng.random() < 0.5:
            prompt, value, kind = f"What is {a}+{b}?", a + b, "add"
        else:
            a, b = max(a, b), min(a, b)
            prompt, value, kind = f"What is {a}-{b}?", a - b, "sub"
    else:
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a = rng.randint(3, 20)
        if rng.random() < 0.5:
            b = rng.randint(1, 9)
            action, value, kind = rng.choice(_GAIN).format(b=b), a + b, "word_add"
        else:
            b = rng.randint(1, min(a, 9))
            action, value, kind = rng.choice(_LOSS).format(b=b), a - b, "word_sub"
        prompt = f"{name} has {a} {item} and {action}. How many {item}?"
    return prompt, f"\\boxed{{{value}}}", {"kind": kind}


# --------------------------------------------------------------------------- checking


class _VerifyTimeout(BaseException):
    """Raised by our SIGALRM handler; a BaseException so math-verify's `except Exception` lets it out."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise `_VerifyTimeout` after `seconds` of wall-clock time (main thread only).

    The alarm re-arms itself every 10 ms until the block is left: a raise that lands inside a
    garbage-collector or weakref callback is swallowed by the interpreter ("exception ignored"),
    and a single alarm would then let the check run on past its deadline. Such a swallowed raise
    is expected, not an error: while the deadline is armed, `sys.unraisablehook` drops our own
    timeout and hands every other unraisable exception to the hook that was there before (a
    test runner counts them as failures; a service logs them as crashes)."""

    left = False

    def on_alarm(signum: int, frame: object) -> None:
        if left:
            return
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        raise _VerifyTimeout()

    previous_hook = sys.unraisablehook

    def drop_own_timeout(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, _VerifyTimeout):
            previous_hook(unraisable)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    sys.unraisablehook = drop_own_timeout
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        # An alarm due at this very moment may still raise here; the next one is 10 ms away, so
        # the retry ends, and from `left` on the handler neither raises nor re-arms.
        while not left:
            with contextlib.suppress(_VerifyTimeout):
                left = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = previous_hook


def _math_verify() -> Any:
    """Import math-verify lazily (sympy takes ~1 s) and silence its "timeout disabled" warning."""
    import math_verify
    import math_verify.grader
    import math_verify.parser

    # We pass timeouts of None (SIGALRM-based ones would clash with our own deadline), which
    # makes math-verify log a warning once per process; our deadline replaces them.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


def _parse_answer(text: str) -> list[Any]:
    return list(_math_verify().parse(text, parsing_timeout=None))


_DELIMITED = re.compile(r"\\boxed|(?<!\\)\$|\\\(|\\\[")
"""A gold already written for the parser: boxed, or in `$...$`, `\\(...\\)`, `\\[...\\]`."""
_WORDS = re.compile(r"[A-Za-z]{2,}(?: [A-Za-z]+)*")
"""A plain-text gold (`Monday`, `no solution`): two letters or more, words only."""


def gold_latex(gold: str) -> str:
    """The gold answer as text math-verify parses as the whole answer (see the module docstring).

    `3\\sqrt{2}` -> `$3\\sqrt{2}$`; `Monday` -> `$\\text{Monday}$`; `$x=3$`, `\\boxed{7}` unchanged;
    `...#### 72` (a GSM8K solution) -> `$72$`.
    """
    text = gold.strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip() or text
    if _DELIMITED.search(text):
        return text
    if _WORDS.fullmatch(text):
        return f"$\\text{{{text}}}$"
    return f"${text}$"


_TOKEN = re.compile(r"\\[A-Za-z]+|[^\s\\{}$]")


def boxed_contents(text: str) -> list[str]:
    """The contents of every `\\boxed{...}` in `text`, in order (braces matched; escaped
    braces `\\{ \\}` are characters, not groups; `\\boxed 5` boxes one token; an unclosed box
    ends the scan)."""
    out: list[str] = []
    pos = 0
    while (found := text.find("\\boxed", pos)) >= 0:
        start = found + len("\\boxed")
        while start < len(text) and text[start].isspace():
            start += 1
        if start >= len(text):
            break
        if text[start] != "{":  # `\\boxed 5`, `\\boxed\\pi`: one token
            token = _TOKEN.match(text, start)
            if token:
                out.append(token.group())
            pos = token.end() if token else start + 1
            continue
        depth, i = 0, start
        while i < len(text):
            char = text[i]
            if char == "\\":
                i += 2
                continue
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        if depth:
            break
        out.append(text[start + 1 : i])
        pos = i + 1
    return out


def answer_text(response: str) -> str:
    """What math-verify parses of a final response: the response itself, except that several
    boxed answers are all of them as one set (`\\boxed{a}\\boxed{b}`, read as {a, b}).

    math-verify alone reads adjacent boxes as a set but, when each sits in its own `$...$`,
    only the last one, so "$\\boxed{3}$. Or maybe $\\boxed{3\\sqrt2}$" would be graded as a
    committed 3\\sqrt2. A response is judged on every answer it boxes: a hedge is a set, which
    equals a single gold only if all its elements do. A response with no delimited math at
    all has its runs of LaTeX delimited (`delimit_inline_math`).
    """
    if not any(mark in response for mark in ("\\boxed", "$", "\\(", "\\[")):
        return delimit_inline_math(response)
    if response.count("\\boxed") < 2:
        return response
    contents = list(dict.fromkeys(c.strip() for c in boxed_contents(response)))
    contents = [c for c in contents if c]
    if len(contents) < 2:
        return f"\\boxed{{{contents[0]}}}" if contents else response
    return "\n".join(f"\\boxed{{{c}}}" for c in contents)


@functools.lru_cache(maxsize=1024)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    """The parsed gold: as `gold_latex` writes it, else boxed, else as it is."""
    gold = normalise_notation(gold)
    for text in (gold_latex(gold), f"\\boxed{{{gold.strip()}}}", gold):
        parsed = _parse_answer(text)
        if parsed:
            return tuple(parsed)
    return ()


def _unevaluated(gold: Sequence[Any], pred: Sequence[Any]) -> str | None:
    """Why the parsed answer is not in closed form (`math_closed_form`), or None."""
    return not_closed_form(gold, pred)


MAX_NESTING = 60
"""Brackets nested deeper than this are refused before the answer is parsed: no closed form
needs them, and the parser's time grows with the depth (a deadline would catch it, as `timeout`)."""


def _nesting(text: str) -> int:
    """The deepest bracket nesting of `text` (braces, parentheses, square brackets)."""
    depth = deepest = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth = max(0, depth - 1)
    return deepest


def check_answer(gold: str, completion: str, timeout_s: float) -> Check:
    """Score one completion against a gold answer. Must run in the main thread of its process.

    Never raises for anything the completion contains: its failures are verdicts on it.
    """
    response = strip_thinking(completion)
    if not response:
        return NO_ANSWER, "empty response"
    phase = "gold"
    try:
        with _deadline(timeout_s):
            try:
                gold_parsed = _parse_gold(gold)
            except Exception as err:
                log.warning("gold answer %.100r cannot be parsed", gold, exc_info=True)
                return INFRA_ERROR, f"gold answer {gold!r:.100} cannot be parsed: {err!r:.200}"
            if not gold_parsed:
                log.warning("gold answer %.100r parses to nothing", gold)
                return INFRA_ERROR, f"gold answer {gold!r:.100} cannot be parsed"
            phase = "answer"
            text = answer_text(normalise_notation(response))
            if (depth := _nesting(text)) > MAX_NESTING:  # before the parser, whose time grows with it
                return WRONG_ANSWER, f"not a closed form (nested too deep: {depth} levels)"
            try:
                pred = _parse_answer(text)
                if not pred:
                    return NO_ANSWER, "no answer found"
                if why := _unevaluated(gold_parsed, pred):
                    return WRONG_ANSWER, f"not a closed form ({why})"
                correct = _math_verify().verify(
                    list(gold_parsed), pred, timeout_seconds=None, allow_set_relation_comp=True
                )
            except (Exception, RecursionError) as err:  # the completion's text made the parser fail
                return PARSE_ERROR, f"answer cannot be checked: {type(err).__name__}"
    except _VerifyTimeout:
        if phase == "gold":
            log.warning("gold answer %.100r took over %gs to parse", gold, timeout_s)
            return INFRA_ERROR, f"gold answer {gold!r:.100} took over {timeout_s:g}s to parse"
        return TIMEOUT, f"parse+verify exceeded {timeout_s:g}s"
    if correct:
        return OK, ""
    return WRONG_ANSWER, f"got {pred[-1]!s:.60}"


def _warm_worker() -> None:
    _parse_gold("\\boxed{1}")


def _ping() -> bool:
    return True


# --------------------------------------------------------------------------- domain


class MathDomain:
    """The math domain: problems plus a math-verify scorer safe to call from any thread."""

    name = "math"

    def __init__(
        self,
        config: MathReward | None = None,
        *,
        cache_size: int = 4096,
        worker_grace_s: float = 2.0,
        worker_start_timeout_s: float = 120.0,
        workers: int | None = None,
    ) -> None:
        self.config = config or MathReward()
        self.worker_grace_s = worker_grace_s
        """Extra seconds the outer (worker) timeout allows over `config.timeout_s`."""
        self.worker_start_timeout_s = worker_start_timeout_s
        self.workers = workers or default_size(cap=4)
        """Worker processes checking off the main thread (each holds its own sympy, ~150 MB)."""
        self._cache: LruCache[tuple[str, str], RewardVerdict] = LruCache(cache_size)
        self._pool: WorkerPool | None = None
        self._pool_lock = threading.Lock()
        self._worker_task: WorkerTask = check_answer
        """Function run in the worker process; module-level so it pickles (tests swap it)."""
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # ----------------------------------------------------------------- problems

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return generate_problems(self.name, split, n, seed, draw_math_problem)

    # ----------------------------------------------------------------- scoring

    def score(self, problem: Problem, completion: str) -> RewardVerdict:
        return self.score_batch([problem], [completion])[0]

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        keys = [(p.answer, c) for p, c in zip(problems, completions, strict=True)]
        verdicts: dict[tuple[str, str], RewardVerdict] = {}
        todo: list[tuple[str, str]] = []
        for key in dict.fromkeys(keys):
            cached = self._cache.get(key)
            if cached is not None:
                verdicts[key] = cached
            else:
                todo.append(key)
        if todo:
            if threading.current_thread() is threading.main_thread():
                checks = [check_answer(g, c, self.config.timeout_s) for g, c in todo]
            else:
                checks = self._check_in_worker(todo)
            for key, (reason, detail) in zip(todo, checks, strict=True):
                verdict = RewardVerdict(1.0 if reason == OK else 0.0, reason, detail)
                verdicts[key] = verdict
                if reason not in (INFRA_ERROR, TIMEOUT):  # both may pass on a retry
                    self._cache.put(key, verdict)
        return [verdicts[key] for key in keys]

    def close(self) -> None:
        """Stop the worker processes, if any were started (they restart on the next off-thread use)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # ----------------------------------------------------------------- worker processes

    def _start_pool(self) -> WorkerPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = WorkerPool(
                    self.workers,
                    initializer=_warm_worker,
                    start_timeout_s=self.worker_start_timeout_s,
                    name="cascade-math",
                    preload=("cascade.domains.math", "math_verify"),
                )
                if self._finalizer is not None:
                    self._finalizer.detach()
                self._finalizer = weakref.finalize(self, self._pool.close)
            return self._pool

    def _check_in_worker(self, items: list[tuple[str, str]]) -> list[Check]:
        """Checks in the worker processes, in order; each item has its own outer timeout."""
        timeout_s = self.config.timeout_s
        results: list[Check] = [(INFRA_ERROR, "not checked")] * len(items)
        tasks = [(gold, completion, timeout_s) for gold, completion in items]
        for i, outcome in self._start_pool().run(
            self._worker_task, tasks, timeout_s=timeout_s + self.worker_grace_s
        ):
            results[i] = _check_of(outcome, timeout_s)
        return results


def _check_of(outcome: Outcome, timeout_s: float) -> Check:
    if outcome.kind == "ok":
        reason, detail = outcome.value
        return str(reason), str(detail)
    if outcome.kind == "timeout":  # the completion kept the check running past its deadline
        return TIMEOUT, f"worker exceeded {timeout_s:g}s (killed)"
    if outcome.kind == "died":
        return INFRA_ERROR, f"math {outcome.detail}"
    return INFRA_ERROR, f"math worker: {outcome.detail}"

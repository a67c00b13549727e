"""A user's own reward function as a domain's verifier (`verifier: python`, `PythonReward`).

The function is named by import path (`package.module:function`) and called once per completion
in killable worker processes (`worker_pool.WorkerPool`), never in the caller's process: each call
has `time_limit_s`, a call that does not return is killed with its worker, and an import that
fails is one clear error when the domain is prepared (at the start of a run), not a traceback at
its first step.

    def score(completion: str, answer: str, *, prompt: str, meta: dict, **options) -> float | dict

`completion` is the response after the reasoning block (`strip_thinking`: what every built-in
verifier judges; an answer written only inside the reasoning never reaches the function; an
empty response is `no_answer` without a call). It returns the reward (a
finite number), or a mapping with `reward` and optionally `reason` (one of the verdict reasons)
and `detail`. Anything else (an exception, a timeout, a value that is not a finite number) is the
function's failure, judged `infra_error`: masked out of training and evals, never a reward of 0
that would train the policy against a bug.
"""

from __future__ import annotations

import importlib
import math
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cascade.config import PythonReward
from cascade.domains.base import (
    INFRA_ERROR,
    NO_ANSWER,
    OK,
    PARSE_ERROR,
    RUNTIME_ERROR,
    TIMEOUT,
    TRUNCATED,
    WRONG_ANSWER,
    Problem,
    RewardVerdict,
)
from cascade.domains.worker_pool import Outcome, WorkerPool, in_worker
from cascade.model.chat import strip_thinking

REASONS = frozenset({OK, WRONG_ANSWER, NO_ANSWER, PARSE_ERROR, TIMEOUT, RUNTIME_ERROR, TRUNCATED})
"""Reasons a function may give its verdict (never `infra_error`: that is the platform's)."""

_LOADED: dict[tuple[str, tuple[str, ...]], Callable[..., Any]] = {}


def load_function(function: str, python_path: Sequence[str] = ()) -> Callable[..., Any]:
    """The callable `module:name` names (imported once per process); ValueError saying why not."""
    key = (function, tuple(python_path))
    if key in _LOADED:
        return _LOADED[key]
    module_name, _, attr = function.partition(":")
    for directory in reversed(python_path):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ValueError(f"cannot import {module_name!r}: {type(err).__name__}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{module_name!r} has no function {attr!r}")
    _LOADED[key] = fn
    return fn


def call_function(
    function: str,
    python_path: tuple[str, ...],
    options: Mapping[str, Any],
    completion: str,
    answer: str,
    prompt: str,
    meta: Mapping[str, Any],
) -> tuple[float, str, str]:
    """One call in a worker: (reward, reason, detail) from what the function returned."""
    fn = load_function(function, python_path)
    value = fn(completion, answer, prompt=prompt, meta=dict(meta), **options)
    reason, detail = "", ""
    if isinstance(value, Mapping):
        reason, detail = str(value.get("reason", "")), str(value.get("detail", ""))
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"returned {value!r:.80} (expected a finite number or {{'reward': number}})")
    if reason and reason not in REASONS:
        raise TypeError(f"returned the reason {reason!r:.40}, not one of {', '.join(sorted(REASONS))}")
    return float(value), reason, detail[:300]


class CustomDomain:
    """The verifier of a `python` domain (module docstring)."""

    name = "python"

    def __init__(self, config: PythonReward) -> None:
        self.config = config
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        raise ValueError("a python verifier has no problems of its own (prompts: jsonl or hf)")

    def prepare(self) -> None:
        """Import the function here, once: a run with a bad `function` fails at its start."""
        try:
            load_function(self.config.function, self._python_path())
        except ValueError as err:
            raise ValueError(f"reward.function {self.config.function!r}: {err}") from None

    def _python_path(self) -> tuple[str, ...]:
        return tuple(str(p) for p in self.config.python_path)

    def _workers(self) -> WorkerPool:
        with self._lock:
            if self._pool is None:
                self._pool = WorkerPool(self.config.workers, name="cascade-python-reward")
            return self._pool

    def score(self, problem: Problem, completion: str) -> RewardVerdict:
        return self.score_batch([problem], [completion])[0]

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        verdicts: list[RewardVerdict | None] = [None] * len(problems)
        tasks: list[tuple[Any, ...]] = []
        slots: list[int] = []
        for i, (problem, completion) in enumerate(zip(problems, completions, strict=True)):
            response = strip_thinking(completion)
            if not response:
                verdicts[i] = RewardVerdict(0.0, NO_ANSWER, "no response after the reasoning")
                continue
            options = dict(self.config.options)
            args = (self.config.function, self._python_path(), options, response)
            tasks.append((*args, problem.answer, problem.prompt, problem.meta))
            slots.append(i)
        limit = self.config.time_limit_s
        if tasks and in_worker():  # already a killable worker with its own deadline (reward service)
            for k, task in enumerate(tasks):
                try:
                    outcome = Outcome("ok", call_function(*task))
                except Exception as err:
                    outcome = Outcome("error", detail=f"{type(err).__name__}: {err!r:.300}")
                verdicts[slots[k]] = self._verdict(outcome)
        elif tasks:
            for k, outcome in self._workers().run(call_function, tasks, timeout_s=limit):
                verdicts[slots[k]] = self._verdict(outcome)
        return [v if v is not None else RewardVerdict(0.0, INFRA_ERROR, "not scored") for v in verdicts]

    def _verdict(self, outcome: Outcome) -> RewardVerdict:
        if outcome.kind != "ok":
            what = {"timeout": f"took over its {self.config.time_limit_s:g}s (killed)"}.get(
                outcome.kind, outcome.detail or outcome.kind
            )
            return RewardVerdict(0.0, INFRA_ERROR, f"{self.config.function}: {what}"[:400])
        reward, reason, detail = outcome.value
        if not reason:
            reason = OK if reward >= self.config.pass_threshold else WRONG_ANSWER
        return RewardVerdict(reward, reason, detail)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

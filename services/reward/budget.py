"""Each item's time budget on the Celery workers: an item that spends it gets its own verdict.

A worker scores a task's items one at a time (`score_each`), each within `budget_s` seconds of
its start. What bounds an item:
- code and swe execution: the sandbox stops each program at the reward's `time_limit_s`;
- agent episodes: their python tool calls, counted together. The domain's python tool is
  swapped for `BudgetedPython`, which refuses a call once the item's budget is spent, runs a
  call with at most what is left, and stops the episode when a call ends past the budget
  (`ItemOverBudget`, a `BaseException`, so neither the tool environment nor the domain takes
  it for a tool's error).
An item stopped so is judged `timeout` with the domain's lowest reward (the completion kept
its verifier busy: a verdict on it, as the front's own processes judge a slow light item),
never `infra_error`, and the task goes on with the next item.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cascade.domains import Domain, RewardVerdict
from cascade.domains.base import TIMEOUT
from cascade.domains.length_bound import floor_reward
from cascade.tools.builtin import PythonTool
from services.reward.batch import UNSPLITTABLE, Batch, DomainCache


class ItemOverBudget(BaseException):
    """The item being scored has spent its time budget (raised inside a domain's tool call)."""


@dataclass
class BudgetedPython(PythonTool):
    """The python tool of one domain, bounded by the deadline of the item now scored."""

    deadline: float | None = None

    def run(self, arguments: Mapping[str, Any]) -> str:
        if self.deadline is None:
            return super().run(arguments)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ItemOverBudget
        limits = dataclasses.replace(self.limits, time_limit_s=max(0.05, min(self.limits.time_limit_s, left)))
        call = PythonTool(limits, self.backend, self.settings, self.name)
        try:
            response = call.run(arguments)
        except Exception:  # a tool error (the program timed out at what was left, ...)
            if time.monotonic() >= self.deadline:
                raise ItemOverBudget from None
            raise
        if time.monotonic() >= self.deadline:
            raise ItemOverBudget
        return response


def _budgeted_python(domain: Domain) -> BudgetedPython | None:
    """The domain's python tool, made a `BudgetedPython` once (None: the domain has none)."""
    while (inner := getattr(domain, "inner", None)) is not None:  # behind `length_bound`
        domain = inner
    tool = getattr(domain, "python", None)
    if isinstance(tool, BudgetedPython):
        return tool
    if isinstance(tool, PythonTool):
        budgeted = BudgetedPython(tool.limits, tool.backend, tool.settings, tool.name)
        domain.python = budgeted  # type: ignore[attr-defined]
        return budgeted
    return None


def over_budget(domain: str, budget_s: float) -> RewardVerdict:
    detail = f"scoring took over its {budget_s:g}s budget (stopped)"
    return RewardVerdict(floor_reward(domain), TIMEOUT, detail)


def score_each(
    domains: DomainCache,
    batch: Batch,
    budget_s: float | None,
    done: Callable[[int, RewardVerdict], None] = lambda i, v: None,
) -> list[RewardVerdict]:
    """The batch's verdicts, item by item (`done` hears of each as it is known), each item
    within `budget_s` (None: no budget). An `UNSPLITTABLE` domain's batch is scored whole."""
    n = len(batch.problems)
    if batch.domain.name in UNSPLITTABLE or n == 0:
        verdicts = domains.score(batch)
        for i, verdict in enumerate(verdicts):
            done(i, verdict)
        return verdicts
    tool: BudgetedPython | None = None
    if budget_s is not None:
        try:
            tool = _budgeted_python(domains.get(batch.domain))
        except Exception:  # `domains.score` says why the domain cannot be built
            tool = None
    verdicts = []
    for i in range(n):
        one = Batch(batch.domain, batch.problems[i : i + 1], batch.completions[i : i + 1])
        if tool is not None and budget_s is not None:
            tool.deadline = time.monotonic() + budget_s
        try:
            (verdict,) = domains.score(one)
        except ItemOverBudget:
            verdict = over_budget(batch.domain.kind, budget_s or 0.0)
        finally:
            if tool is not None:
                tool.deadline = None
        verdicts.append(verdict)
        done(i, verdict)
    return verdicts

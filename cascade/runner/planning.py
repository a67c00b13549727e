"""Which requests a step sends, with which seeds: the one place the seed rule lives.

`seeding: per_request` (always, when generation runs in other processes): every request samples
from a generator seeded by (run seed, "rl", batch number, request index), distillation students
by (run seed, "distill", global step, teacher), so any process that generates a request makes the
same completions. `seeding: stream` (embedded only): one request per batch, no seed, the run's
one generator.
"""

from __future__ import annotations

from typing import Any

from cascade.config import StageConfig
from cascade.domains.base import Problem
from cascade.rollout.requests import PromptRequest, problem_fields, request_seed


def plan_requests(
    *,
    seed: int,
    batch: int,
    stage: StageConfig,
    domain: str,
    problems: list[Problem],
    prompt_ids: list[list[int]],
    budget: int,
    policy_version: int,
    per_request: bool,
    prompts_per_request: int,
    reward_config: dict[str, Any] | None,
    attempt: str,
    first_index: int = 0,
) -> list[PromptRequest]:
    """The requests of one domain's prompts in batch `batch` (a step over several domains sends
    each domain's from `first_index` on: a request's index is its place in the batch)."""
    g = stage.grpo
    n = prompts_per_request if per_request else max(len(problems), 1)
    requests = []
    for k, start in enumerate(range(0, len(problems), n), start=first_index):
        part = problems[start : start + n]
        requests.append(
            PromptRequest(
                batch=batch,
                index=k,
                domain=domain,
                policy_version=policy_version,
                seed=request_seed(seed, "rl", batch, k) if per_request else None,
                group_size=g.group_size,
                max_tokens=budget,
                temperature=g.temperature,
                top_p=g.top_p,
                overlong=g.overlong,
                problems=[problem_fields(p) for p in part],
                prompt_ids=prompt_ids[start : start + n],
                sample_ids=[[f"b{batch}/{p.id}/{j}" for j in range(g.group_size)] for p in part],
                reward_config=reward_config,
                attempt=attempt,
                thinking=g.thinking,
            )
        )
    return requests


def distill_seed(seed: int, global_step: int, teacher: str, *, per_request: bool) -> int | None:
    return request_seed(seed, "distill", global_step, teacher) if per_request else None

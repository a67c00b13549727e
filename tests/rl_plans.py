"""Random RL plans for the learner's update tests: groups of 3, 4, 2 and 4 rows, each group one
random prompt, each row a random completion of 2-11 tokens, random advantages."""

from __future__ import annotations

import torch

from cascade.algo.turn_mask import TurnLayout
from cascade.runner.rl import RlPlan


def random_plan(
    seed: int, *, stale: bool = False, multi_turn: bool = False, group_sizes: tuple[int, ...] = (3, 4, 2, 4)
) -> RlPlan:
    """`stale`: engine log-probs far from any policy's (ratios on both sides of the clip);
    `multi_turn`: the middle third of each row is the environment's reply, never trained."""
    g = torch.Generator().manual_seed(seed)
    rows_p, rows_c, groups = [], [], []
    for gid, size in enumerate(group_sizes):
        prompt = torch.randint(5, 200, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(size):
            rows_p.append(prompt)
            rows_c.append(
                torch.randint(5, 200, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
            )
            groups.append(gid)
    old = [(-torch.rand(len(c), generator=g) * 8).tolist() for c in rows_c] if stale else None
    layouts = None
    if multi_turn:
        layouts = []
        for c in rows_c:
            a, b = len(c) // 3, 2 * len(c) // 3
            layouts.append(TurnLayout(((a, True), (b - a, False), (len(c) - b, True))))
    return RlPlan(
        metrics={"reward_mean": 0.5},
        prompt_ids=rows_p,
        completion_ids=rows_c,
        group_ids=groups,
        advantages=torch.randn(len(groups), generator=g).tolist(),
        old_logprobs=old,
        temperature=1.0,
        global_rows=len(groups),
        layouts=layouts,
    )

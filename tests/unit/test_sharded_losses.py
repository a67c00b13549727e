"""Global loss normalisation: N ranks, each with its share of the batch and the counts summed
over the ranks, compute together exactly the loss (and gradient) of one process on the whole
batch. The ranks are threads here, summing through a barrier (the all-reduce's arithmetic)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from cascade.algo import (
    FullDistillInput,
    GrpoLossInput,
    SampledDistillInput,
    TopkDistillInput,
    full_distill_loss,
    grpo_loss,
    sampled_distill_loss,
    topk_distill_loss,
)
from cascade.distill.samples import DistillSamples, TeacherTokens
from cascade.engine.batch import build_batch
from cascade.runner.distill import DistillData, share_distill
from cascade.runner.rl import RlPlan


class ThreadRanks:
    """`size` threads acting as ranks; `sum` is their all-reduce."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.slots: list[torch.Tensor | None] = [None] * size
        self.local = threading.local()

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        self.slots[self.local.rank] = t.detach().clone()
        self.barrier.wait()
        out = torch.stack([s for s in self.slots if s is not None]).sum(0).to(t.dtype)
        self.barrier.wait()
        return out

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as err:  # surfaced below
                errors.append(err)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        return results


def _rows(n: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand((n, t), generator=g) * 3
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    return logp, mask


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
@pytest.mark.parametrize("size", [2, 3])
def test_grpo_shares_add_up_to_the_whole(aggregation: str, size: int) -> None:
    logp, mask = _rows(12, 7, 0)
    groups = torch.arange(12) // 4  # 3 groups of 4
    adv = torch.linspace(-1, 1, 12)
    old = logp + 0.05 * torch.randn(12, 7, generator=torch.Generator().manual_seed(1))
    ref = logp - 0.1

    def loss(rows: torch.Tensor, reduce: Any, leaf: torch.Tensor) -> Any:
        return grpo_loss(
            GrpoLossInput(
                logprobs=leaf[rows],
                advantages=adv[rows],
                mask=mask[rows],
                group_ids=groups[rows],
                old_logprobs=old[rows],
                ref_logprobs=ref[rows],
                aggregation=aggregation,  # type: ignore[arg-type]
                kl_coef=0.1,
                reduce=reduce,
            )
        )

    whole_leaf = logp.clone().requires_grad_(True)
    whole = loss(torch.arange(12), None, whole_leaf)
    whole.loss.backward()

    ranks = ThreadRanks(size)
    leaves = [logp.clone().requires_grad_(True) for _ in range(size)]
    group_list = list(range(3))

    def part(rank: int) -> Any:
        mine = group_list[3 * rank // size : 3 * (rank + 1) // size]
        rows = torch.tensor([i for i in range(12) if int(groups[i]) in mine], dtype=torch.long)
        if rows.numel() == 0:  # an empty share counts nothing but still takes part
            out = loss(torch.tensor([0]), ranks.sum, leaves[rank])
        else:
            out = loss(rows, ranks.sum, leaves[rank])
        out.loss.backward()
        return out

    parts = ranks.run(part)
    total = sum(float(p.loss.detach()) for p in parts)
    assert total == pytest.approx(float(whole.loss), abs=1e-6)
    grad = sum(leaf.grad for leaf in leaves)
    assert torch.allclose(grad, whole_leaf.grad, atol=1e-7)
    for key in ("clip_fraction", "ratio_mean", "n_tokens", "kl", "pg_loss"):
        for p in parts:  # every rank reports the global metric
            assert p.metrics[key] == pytest.approx(whole.metrics[key], abs=1e-6), key


@pytest.mark.parametrize("kind", ["full", "topk", "sampled"])
def test_distill_shares_add_up_to_the_whole(kind: str) -> None:
    n, t, v = 5, 6, 11
    g = torch.Generator().manual_seed(3)
    student_logits = torch.randn((n, t, v), generator=g)
    teacher_logits = torch.randn((n, t, v), generator=g)
    _, mask = _rows(n, t, 4)
    rollout = torch.log_softmax(student_logits, -1)[..., 0] + 0.3 * torch.randn((n, t), generator=g)

    def loss(rows: slice, reduce: Any, leaf: torch.Tensor, m: torch.Tensor | None = None) -> Any:
        m = mask[rows] if m is None else m
        if kind == "full":
            return full_distill_loss(FullDistillInput(leaf[rows], teacher_logits[rows], m, 1.3, reduce))
        if kind == "topk":
            lp, ids = torch.log_softmax(teacher_logits[rows], -1).topk(4, dim=-1)
            return topk_distill_loss(TopkDistillInput(leaf[rows], ids, lp, m, 0.8, reduce))
        s = torch.log_softmax(leaf[rows], -1)[..., 0]
        tl = torch.log_softmax(teacher_logits[rows], -1)[..., 0]
        return sampled_distill_loss(SampledDistillInput(s, tl, m, rollout[rows], reduce=reduce))

    whole_leaf = student_logits.clone().requires_grad_(True)
    whole = loss(slice(0, n), None, whole_leaf)
    whole.loss.backward()
    ranks = ThreadRanks(3)
    leaves = [student_logits.clone().requires_grad_(True) for _ in range(3)]
    cuts = [slice(0, 2), slice(2, 5), slice(5, 5)]  # the last rank's share is empty

    def part(rank: int) -> Any:
        rows = cuts[rank]
        if rows.start == rows.stop:
            out = loss(slice(0, 1), ranks.sum, leaves[rank], torch.zeros((1, t)))
        else:
            out = loss(rows, ranks.sum, leaves[rank])
        out.loss.backward()
        return out

    parts = ranks.run(part)
    assert sum(float(p.loss.detach()) for p in parts) == pytest.approx(float(whole.loss), abs=1e-6)
    grad = sum(leaf.grad for leaf in leaves)
    assert torch.allclose(grad, whole_leaf.grad, atol=1e-7)
    for key, value in whole.metrics.items():
        assert parts[0].metrics[key] == pytest.approx(value, abs=1e-6), key


def _plan(groups: list[int]) -> RlPlan:
    return RlPlan(
        metrics={"reward_mean": 0.5},
        prompt_ids=[[i] for i in range(len(groups))],
        completion_ids=[[i, i] for i in range(len(groups))],
        group_ids=groups,
        advantages=[float(i) for i in range(len(groups))],
        old_logprobs=None,
        temperature=1.0,
        global_rows=len(groups),
    )


def test_rl_shares_are_whole_groups_and_cover_the_plan_once() -> None:
    plan = _plan([0, 0, 0, 2, 2, 5, 5, 5, 5, 7])  # uneven groups after filtering
    for size in (1, 2, 3, 4, 6):
        shares = [plan.share(r, size) for r in range(size)]
        seen = [row for s in shares for row in s.prompt_ids]
        assert sorted(seen) == sorted(plan.prompt_ids)
        owners: dict[int, int] = {}
        for r, s in enumerate(shares):
            for gid in s.group_ids:
                assert owners.setdefault(gid, r) == r  # no group is split
            assert s.global_rows == plan.global_rows
    assert plan.share(0, 6).empty  # more ranks than groups: some rank gets none


def test_distill_share_cuts_rows_and_the_teachers_tokens_to_its_layout() -> None:
    prompts = [[1, 2], [3], [4, 5, 6], [7]]
    completions = [[9] * 5, [9, 9], [9], [9] * 3]
    sb = build_batch(prompts, completions, 0)
    lp = torch.arange(4 * 5, dtype=torch.float).view(4, 5)
    data = DistillData(
        DistillSamples("math", prompts, completions, [[0.0] * len(c) for c in completions], 1.0),
        sb,
        TeacherTokens(logprobs=lp),
    )
    second = share_distill(data, 1, 2, pad_id=0)
    assert second.samples.completion_ids == completions[2:]
    assert second.batch.completion_ids.shape == (2, 3)
    assert second.tokens.logprobs is not None
    assert torch.equal(second.tokens.logprobs, lp[2:, :3])
    empty = share_distill(data, 0, 5, pad_id=0)  # 4 rows over 5 ranks: one rank has none
    assert float(empty.batch.completion_mask.sum()) == 0

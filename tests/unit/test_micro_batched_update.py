"""A step cut into micro-batches makes the one-pass update: the same loss, gradients, metrics and
updated weights, for every term (GRPO in both aggregations with staleness, the clip and the k3
reference; multi-turn masked rows; each distillation mode), whatever the cut, with the
vocabulary in chunks or not and with activation checkpointing on or off.

The bound asserted: float32 rounding of sums taken in another order. Each parameter's gradient
(after clipping, as the optimizer takes it) differs by at most 1e-5 of the tensor's largest
entry; the weights after one step by float32 ulps (rtol 1e-6); each metric by 1e-5 relative
(1e-6 absolute); the metrics' keys are the same, plus the micro-batch counts and `padding_share`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rl_plans import random_plan

from cascade.accel import resolve_learner
from cascade.algo import GrpoNorms, grpo_normalisers
from cascade.config import LearnerConfig, StageConfig
from cascade.distill.modes import local_teacher_tokens
from cascade.distill.samples import DistillSamples
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logprobs, needs_chunks
from cascade.engine.microbatch import MicroBatching, micro_batch_spans, padded_tokens
from cascade.model.loading import load_model_weights_only, load_policy
from cascade.runner.distill import DistillData
from cascade.runner.frozen_models import FrozenModelCache
from cascade.runner.rl import RlPlan
from cascade.runner.update import UpdateRequest, run_update

# ---------------------------------------------------------------- the cut itself (hand-computed)


def test_spans_fill_the_token_budget_in_order() -> None:
    # rows (prompt, completion): (2,3) (2,4) (1,6) (3,1); budget 14 tokens
    # rows 0-1: 2 x (2+4) = 12 <= 14; adding row 2: 3 x (2+6) = 24 > 14 -> cut
    # rows 2-3: 2 x (3+6) = 18 > 14 -> row 2 alone, then row 3
    spans = micro_batch_spans([2, 2, 1, 3], [3, 4, 6, 1], MicroBatching(tokens=14))
    assert spans == [(0, 2), (2, 3), (3, 4)]


def test_a_row_above_the_budget_is_a_micro_batch_of_its_own() -> None:
    assert micro_batch_spans([5, 1, 1], [50, 1, 1], MicroBatching(tokens=8)) == [(0, 1), (1, 3)]


def test_the_sequence_bound_and_placeholders() -> None:
    assert micro_batch_spans([1] * 5, [1] * 5, MicroBatching(sequences=2)) == [(0, 2), (2, 4), (4, 5)]
    assert micro_batch_spans([1] * 2, [1] * 2, MicroBatching(), at_least=3) == [(0, 2), (2, 2), (2, 2)]
    assert micro_batch_spans([], [], MicroBatching(), at_least=2) == [(0, 0), (0, 0)]


def test_padding_share_counts_each_micro_batch_at_its_widest_row() -> None:
    # span (0,2): 2 x (2+4) = 12 padded for 2+3+2+4 = 11 real; span (2,3): 1 x 7 for 7
    real, padded = padded_tokens([2, 2, 1], [3, 4, 6], [(0, 2), (2, 3)])
    assert (real, padded) == (18, 19)


def test_grpo_normalisers_span_a_group_wherever_its_rows_land() -> None:
    tokens = torch.tensor([3.0, 1.0, 0.0, 4.0])
    groups = torch.tensor([0, 0, 1, 1])
    n = grpo_normalisers(tokens, groups, "token")
    assert n.unit_tokens.tolist() == [4.0, 4.0, 4.0, 4.0] and float(n.n_units) == 2 and float(n.n_tokens) == 8
    s = grpo_normalisers(tokens, groups, "sequence")
    assert s.unit_tokens.tolist() == [3.0, 1.0, 0.0, 4.0] and float(s.n_units) == 3
    assert isinstance(n.rows(1, 3), GrpoNorms) and n.rows(1, 3).unit_tokens.tolist() == [4.0, 4.0]


# ---------------------------------------------------------------- the update, cut or not


def _stage(loss: str, aggregation: str = "token", kl: float = 0.05) -> StageConfig:
    return StageConfig.model_validate(
        {
            "domain": "math",
            "grpo": {
                "kl_coef": kl,
                "learning_rate": 1e-3,
                "max_grad_norm": 100.0,
                "loss_aggregation": aggregation,
                "clip_eps_low": 0.05,
                "clip_eps_high": 0.05,
            },
            "distill": {"loss": loss, "topk": 5, "temperature": 0.9},
        }
    )


def _plan(stale: bool, multi_turn: bool = False) -> RlPlan:
    return random_plan(7, stale=stale, multi_turn=multi_turn)


def _distill(teacher: torch.nn.Module, loss: str, rollout_t: float) -> list[DistillData]:
    g = torch.Generator().manual_seed(11)
    prompts = [[5, 6, 7]] * 3 + [[9, 10]] * 3
    completions = [
        torch.randint(5, 200, (int(torch.randint(2, 10, (1,), generator=g)),), generator=g).tolist()
        for _ in prompts
    ]
    rollout = [(-torch.rand(len(c), generator=g) * 3).tolist() for c in completions]
    samples = DistillSamples("if", prompts, completions, rollout, rollout_t)
    sb = build_batch(prompts, completions, 0)
    return [DistillData(samples, sb, local_teacher_tokens(teacher, sb, _stage(loss).distill))]


def _update(
    model_dir: Path, req: UpdateRequest, fetched: list[DistillData], reference: torch.nn.Module | None
) -> tuple[dict[str, float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    accel = resolve_learner(LearnerConfig(device="cpu"), "float32")
    model = load_policy(model_dir).model
    # plain SGD: the weights' change is the (clipped) gradient itself (AdamW's first step is
    # nearly sign(g), which would turn a last-bit difference of a ~1e-9 gradient into lr)
    optimizer = torch.optim.SGD(model.parameters(), lr=req.lr)
    frozen = FrozenModelCache("float32")
    if reference is not None:
        assert req.reference is not None
        frozen.put("reference", req.reference, reference)
    metrics, _ = run_update(model, optimizer, req, lambda: fetched, accel=accel, frozen=frozen)
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return metrics, grads, model.state_dict()


def _assert_same_update(a: tuple, b: tuple) -> None:
    ma, ga, wa = a
    mb, gb, wb = b
    assert set(ga) == set(gb)
    for k in ga:  # the clipped gradient the optimizer stepped with
        scale = float(ga[k].abs().max()) or 1.0
        assert float((ga[k] - gb[k]).abs().max()) <= 1e-5 * scale, k
    for k in wa:  # the weights after the step: a few float32 ulps apart at most
        assert torch.allclose(wa[k], wb[k], rtol=1e-6, atol=1e-9), k
    for k in sorted(set(ma) & set(mb)):
        assert mb[k] == pytest.approx(ma[k], rel=1e-5, abs=1e-6), k
    assert set(mb) - set(ma) <= {"micro_batches", "padding_share", "distill_if_micro_batches"}
    assert set(ma) <= set(mb)


@pytest.fixture(scope="module")
def models(random_tiny_model: Path) -> dict[str, torch.nn.Module]:
    teacher = load_model_weights_only(random_tiny_model)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    reference = load_model_weights_only(random_tiny_model)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        for p in reference.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return {"teacher": teacher, "reference": reference}


CUTS = {
    "one row each": MicroBatching(sequences=1),
    "a few": MicroBatching(tokens=40),
    "vocab chunks": MicroBatching(tokens=60, logits_chunk_bytes=4 * 384 * 7),
    "checkpointed": MicroBatching(tokens=40, activation_checkpointing=True),
}


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize(
    ("loss", "aggregation", "stale", "multi_turn"),
    [
        ("sampled", "token", True, False),
        ("topk", "sequence", False, False),
        ("full", "token", False, True),
        ("sampled", "sequence", False, True),
    ],
)
def test_a_cut_step_makes_the_one_pass_update(
    random_tiny_model: Path,
    models: dict,
    cut: str,
    loss: str,
    aggregation: str,
    stale: bool,
    multi_turn: bool,
) -> None:
    # the rollout at the loss's temperature (0.9): the sampled term's kept tokens are decided by
    # the student's log-probs, so its normaliser is known only after every micro-batch
    fetched = _distill(models["teacher"], loss, rollout_t=0.9)
    req = UpdateRequest(
        rl=_plan(stale, multi_turn),
        stage=_stage(loss, aggregation),
        stage_step=0,
        lr=1e-3,
        pad_id=0,
        reference=random_tiny_model,
    )
    whole = _update(random_tiny_model, req, fetched, models["reference"])
    parts = _update(random_tiny_model, replace(req, batching=CUTS[cut]), fetched, models["reference"])
    assert parts[0]["micro_batches"] > 1
    _assert_same_update(whole, parts)
    assert 0.0 <= parts[0]["padding_share"] < 1.0
    assert whole[0]["grpo_clip_fraction"] > 0 if stale else True


def test_the_sampled_terms_kept_tokens_are_counted_over_the_step(
    random_tiny_model: Path, models: dict
) -> None:
    fetched = _distill(models["teacher"], "sampled", rollout_t=0.9)
    # behaviour log-probs within ~1 nat of the student's: some tokens in [0.5, 2], some out
    student = load_policy(random_tiny_model).model
    with torch.no_grad():
        lp = completion_logprobs(student, fetched[0].batch, 0.9)
    noise = torch.Generator().manual_seed(3)
    s = fetched[0].samples
    s.rollout_logprobs = [
        (lp[i, : len(c)] + (torch.rand(len(c), generator=noise) * 2.4 - 1.2)).tolist()
        for i, c in enumerate(s.completion_ids)
    ]
    req = UpdateRequest(
        rl=replace(
            _plan(False), global_rows=0, group_ids=[], prompt_ids=[], completion_ids=[], advantages=[]
        ),
        stage=_stage("sampled"),
        stage_step=0,
        lr=1e-3,
        pad_id=0,
        reference=None,
    )
    whole = _update(random_tiny_model, req, fetched, None)
    parts = _update(random_tiny_model, replace(req, batching=MicroBatching(sequences=1)), fetched, None)
    kept = whole[0]["distill_if_kept_fraction"]
    assert 0.0 < kept < 1.0  # some tokens dropped by the [0.5, 2] weight bound: the count matters
    _assert_same_update(whole, parts)


def test_vocabulary_chunks_give_the_plain_forwards_logprobs_and_gradients(random_tiny_model: Path) -> None:
    model = load_policy(random_tiny_model).model
    plan = _plan(False)
    sb = build_batch(plan.prompt_ids, plan.completion_ids, 0)
    small = 4 * 384 * 5  # five positions' logits per chunk
    assert needs_chunks(model, sb, small) and not needs_chunks(model, sb, 2**30)
    grads = []
    values = []
    for chunk in (2**30, small):
        model.zero_grad()
        lp = completion_logprobs(model, sb, 0.8, chunk_bytes=chunk)
        (lp * torch.arange(lp.numel()).view_as(lp).float().sin()).sum().backward()
        values.append(lp.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    assert torch.allclose(values[0], values[1], atol=1e-5)
    assert float((values[0] - values[1]).abs()[sb.completion_mask == 0].max()) == 0.0
    for a, b in zip(grads[0], grads[1], strict=True):  # per tensor, as `_assert_same_update`
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())


def test_a_step_that_fits_one_pass_is_the_old_update_bit_for_bit(
    random_tiny_model: Path, models: dict
) -> None:
    fetched = _distill(models["teacher"], "topk", rollout_t=1.0)
    req = UpdateRequest(
        rl=_plan(True), stage=_stage("topk"), stage_step=0, lr=1e-3, pad_id=0, reference=random_tiny_model
    )
    a = _update(random_tiny_model, req, fetched, models["reference"])
    b = _update(
        random_tiny_model, replace(req, batching=MicroBatching(tokens=10**6)), fetched, models["reference"]
    )
    assert "micro_batches" not in b[0]
    for k in a[2]:
        assert torch.equal(a[2][k], b[2][k])


@pytest.mark.parametrize("loss", ["sampled", "topk", "full"])
def test_a_local_teachers_tokens_in_micro_batches_and_chunks_are_its_one_pass_tokens(
    models: dict, loss: str
) -> None:
    teacher = models["teacher"]
    plan = _plan(False)
    sb = build_batch(plan.prompt_ids, plan.completion_ids, 0)
    cfg = _stage(loss).distill
    whole = local_teacher_tokens(teacher, sb, cfg)
    cut = local_teacher_tokens(teacher, sb, cfg, MicroBatching(tokens=40, logits_chunk_bytes=4 * 384 * 5))
    m = sb.completion_mask > 0
    for name in ("logprobs", "logits", "topk_ids", "topk_logprobs", "logprobs_t1"):
        a, b = getattr(whole, name), getattr(cut, name)
        assert (a is None) == (b is None), name
        if a is None:
            continue
        assert a.shape == b.shape, name
        if name == "topk_ids":  # ties aside, the same ids at every counted position
            assert float((a[m] == b[m]).float().mean()) > 0.99
        else:
            assert torch.allclose(a[m].float(), b[m].float(), atol=1e-5), name

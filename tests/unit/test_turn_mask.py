"""Loss masking of a two-turn completion: the model's tokens count, the tool's never do.

Layout of the one completion row (C = 8):  m m m | e e | m m | pad
(three tokens of turn 1, two of the environment's tool response, two of turn 2, padding).
Expected values are computed by hand from the loss formulas with the five model tokens only.
"""

from __future__ import annotations

import math

import pytest
import torch

from cascade.algo.distill import SampledDistillInput, sampled_distill_loss
from cascade.algo.grpo import GrpoLossInput, grpo_loss
from cascade.algo.turn_mask import TurnLayout, model_token_mask, scatter_model_values

LAYOUT, IDS = TurnLayout.of_pieces([([11, 12, 13], True), ([90, 91], False), ([14, 15], True)])
COMPLETION_MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.float32)
MODEL = [0, 1, 2, 5, 6]
ENV = [3, 4]

# Per model token: current log-probs and the engine's (behaviour) log-probs.
LOGP = [-1.0, -0.5, -2.0, -0.3, -1.2]
OLD = [-1.3, -0.5, -1.5, -0.3, -1.0]


def _row(model_values: list[float], env_values: tuple[float, float], pad: float) -> torch.Tensor:
    row = LAYOUT.scatter(model_values, fill=0.0) + [pad]
    for position, value in zip(ENV, env_values, strict=True):
        row[position] = value
    return torch.tensor([row], dtype=torch.float32)


def test_layout_mask_and_scatter() -> None:
    assert IDS == [11, 12, 13, 90, 91, 14, 15]
    assert LAYOUT.length == 7 and LAYOUT.n_model == 5
    mask = model_token_mask([LAYOUT], COMPLETION_MASK)
    assert mask.tolist() == [[True, True, True, False, False, True, True, False]]
    old = scatter_model_values([LAYOUT], [OLD], width=8, fill=0.0)
    assert old[0, MODEL].tolist() == pytest.approx(OLD)
    assert old[0, ENV + [7]].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="layout covers 7 tokens, the row has 6"):
        model_token_mask([LAYOUT], torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="4 values for 5 model tokens"):
        LAYOUT.scatter(OLD[:4])


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_grpo_token_loss_counts_only_model_tokens(advantage: float) -> None:
    eps_low, eps_high = 0.2, 0.28
    # By hand: ratio r_t = exp(logp - old) over the five model tokens.
    ratios = [math.exp(a - b) for a, b in zip(LOGP, OLD, strict=True)]  # 1.3499, 1, 0.6065, 1, 0.8187
    if advantage > 0:  # r > 1.28 is clipped: token 0
        surrogate = [min(r, 1 + eps_high) * advantage for r in ratios]
        clipped = 1
    else:  # r < 0.8 is clipped: token 2
        surrogate = [max(r, 1 - eps_low) * advantage for r in ratios]
        clipped = 1
    expected = -sum(surrogate) / 5
    if advantage > 0:
        assert expected == pytest.approx(-(1.28 + 1 + math.exp(-0.5) + 1 + math.exp(-0.2)) / 5)

    logp = _row(LOGP, (float("inf"), float("nan")), float("nan")).requires_grad_()
    old = _row(OLD, (float("-inf"), 5.0), float("nan"))
    mask = model_token_mask([LAYOUT], COMPLETION_MASK)
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logp,
            advantages=torch.tensor([advantage]),
            mask=mask,
            group_ids=torch.tensor([0]),
            old_logprobs=old,
            clip_eps_low=eps_low,
            clip_eps_high=eps_high,
        )
    )
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.metrics["n_tokens"] == 5
    assert out.metrics["clip_fraction"] == pytest.approx(clipped / 5)
    assert out.metrics["ratio_mean"] == pytest.approx(sum(ratios) / 5, abs=1e-6)
    out.loss.backward()
    grad = logp.grad
    assert grad is not None
    assert grad[0, ENV + [7]].tolist() == [0.0, 0.0, 0.0]  # tool tokens and padding get nothing
    clipped_token = 0 if advantage > 0 else 2
    for position, r in zip(MODEL, ratios, strict=True):
        want = 0.0 if position == clipped_token else -advantage * r / 5
        assert grad[0, position].item() == pytest.approx(want, abs=1e-6)


def test_tool_tokens_in_the_mask_would_change_the_loss() -> None:
    """The guard above is not vacuous: counting the tool tokens (finite values there) moves it."""
    logp = _row(LOGP, (-0.1, -0.1), 0.0)
    old = _row(OLD, (-3.0, -3.0), 0.0)
    args = {"advantages": torch.tensor([1.0]), "group_ids": torch.tensor([0]), "old_logprobs": old}
    masked = grpo_loss(GrpoLossInput(logprobs=logp, mask=model_token_mask([LAYOUT], COMPLETION_MASK), **args))
    naive = grpo_loss(GrpoLossInput(logprobs=logp, mask=COMPLETION_MASK, **args))
    assert naive.metrics["n_tokens"] == 7
    assert abs(naive.loss.item() - masked.loss.item()) > 0.05


def test_sampled_distillation_scores_only_the_students_tokens() -> None:
    student = LOGP
    teacher = [-0.5, -0.5, -1.0, -0.6, -1.2]
    # By hand, on-policy (w = 1): a_t = t - s = [0.5, 0, 1.0, -0.3, 0];
    # per-token loss -(a_t * s_t) = [0.5, 0, 2.0, -0.09, 0]; mean over 5 = 0.482.
    s = _row(student, (float("nan"), float("-inf")), float("nan")).requires_grad_()
    t = _row(teacher, (0.0, 0.0), float("nan"))
    mask = model_token_mask([LAYOUT], COMPLETION_MASK)
    out = sampled_distill_loss(SampledDistillInput(student_logprobs=s, teacher_logprobs=t, mask=mask))
    assert out.loss.item() == pytest.approx(0.482, abs=1e-6)
    assert out.metrics["reverse_kl"] == pytest.approx(-1.2 / 5, abs=1e-6)
    assert out.metrics["n_tokens"] == 5 and out.metrics["kept_fraction"] == 1.0
    out.loss.backward()
    assert s.grad is not None
    assert s.grad[0].tolist() == pytest.approx([-0.1, 0.0, -0.2, 0.0, 0.0, 0.06, 0.0, 0.0], abs=1e-6)

    # Off-policy: the engine sampled token 2 with log-prob s - 1, so w = e > 2 drops it;
    # the mean runs over the four kept tokens: (0.5 + 0 - 0.09 + 0) / 4 = 0.1025.
    rollout_model = list(student)
    rollout_model[2] -= 1.0
    rollout = _row(rollout_model, (float("inf"), float("inf")), 0.0)
    s2 = _row(student, (0.0, 0.0), 0.0)
    out = sampled_distill_loss(
        SampledDistillInput(student_logprobs=s2, teacher_logprobs=t, mask=mask, rollout_logprobs=rollout)
    )
    assert out.loss.item() == pytest.approx(0.1025, abs=1e-6)
    assert out.metrics["kept_fraction"] == pytest.approx(4 / 5)


def test_full_and_topk_distillation_equal_the_loss_on_the_model_tokens_alone() -> None:
    """Teachers' logits at the tool tokens (here wild) change nothing: the masked two-turn row
    gives the loss of the five model tokens laid out alone."""
    from cascade.algo.distill import FullDistillInput, TopkDistillInput, full_distill_loss, topk_distill_loss

    gen = torch.Generator().manual_seed(0)
    student = torch.randn(1, 8, 6, generator=gen)
    teacher = torch.randn(1, 8, 6, generator=gen)
    teacher[0, ENV] = 1e4 * torch.randn(2, 6, generator=gen)
    student[0, ENV] = float("nan")
    mask = model_token_mask([LAYOUT], COMPLETION_MASK)
    alone = torch.ones(1, 5)
    full = full_distill_loss(FullDistillInput(student, teacher, mask, temperature=2.0))
    full_alone = full_distill_loss(
        FullDistillInput(student[:, MODEL], teacher[:, MODEL], alone, temperature=2.0)
    )
    assert full.loss.item() == pytest.approx(full_alone.loss.item(), rel=1e-6)
    ids = teacher.topk(3, dim=-1).indices
    lps = torch.log_softmax(teacher, dim=-1).gather(-1, ids)
    topk = topk_distill_loss(TopkDistillInput(student, ids, lps, mask))
    topk_alone = topk_distill_loss(TopkDistillInput(student[:, MODEL], ids[:, MODEL], lps[:, MODEL], alone))
    assert topk.loss.item() == pytest.approx(topk_alone.loss.item(), rel=1e-6)
    assert full.metrics["n_tokens"] == topk.metrics["n_tokens"] == 5

"""Distillation losses against hand-computed KLs on a 3-token vocabulary.

Hand values: p = [0.5, 0.25, 0.25], u = uniform [1/3, 1/3, 1/3], ln 2 = 0.693147.
  KL(p || u) = 0.5 ln 1.5 + 0.5 ln 0.75 = 0.058892;
  KL(u || p) = ln(1/3) - (ln 0.5 + 2 ln 0.25) / 3 = 0.056633.
  At T = 2: p_T ∝ sqrt(p) = [0.414214, 0.292893, 0.292893];
  KL(p_T || u) = sum p_T ln(3 p_T) = 0.014221;  KL(u || p_T) = ln(1/3) - sum ln(p_T) / 3 = 0.013810.
"""

from __future__ import annotations

import math

import pytest
import torch

from cascade.algo import (
    FullDistillInput,
    SampledDistillInput,
    TopkDistillInput,
    full_distill_loss,
    sampled_distill_loss,
    topk_distill_loss,
)

P_LOGITS = [math.log(0.5), math.log(0.25), math.log(0.25)]
NAN3 = [float("nan")] * 3


def _full_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # token0: teacher p, student u; token1: teacher u, student p; token2: padding with garbage.
    student = torch.tensor([[[0.0, 0.0, 0.0], P_LOGITS, NAN3]])
    teacher = torch.tensor([[P_LOGITS, [0.0, 0.0, 0.0], [float("inf"), 1e4, -1e4]]])
    return student, teacher, torch.tensor([[1, 1, 0]])


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [
        (1.0, 0.057762),  # (0.058892 + 0.056633) / 2
        (2.0, 0.056062),  # (0.014221 + 0.013810) / 2 * 2^2
    ],
)
def test_full_kl_hand_values(temperature: float, expected: float) -> None:
    student, teacher, mask = _full_case()
    student.requires_grad_()
    out = full_distill_loss(
        FullDistillInput(student_logits=student, teacher_logits=teacher, mask=mask, temperature=temperature)
    )
    assert out.loss.item() == pytest.approx(expected, abs=2e-6)
    assert out.metrics["n_tokens"] == 2
    out.loss.backward()
    assert student.grad is not None
    assert torch.equal(student.grad[0, 2], torch.zeros(3))
    if temperature == 1.0:
        # d KL(p || softmax(z)) / dz = softmax(z) - p, over 2 tokens: (u - p) / 2 for token0.
        torch.testing.assert_close(student.grad[0, 0], torch.tensor([-0.083333, 0.041667, 0.041667]))


# Top-k: teacher full p = [0.5, 0.25, 0.25], top-2 ids [0, 1] -> p_hat = [2/3, 1/3];
# student q = [0.2, 0.3, 0.5] (not renormalised over the top-k).
Q_LOGITS = [math.log(0.2), math.log(0.3), math.log(0.5)]


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [
        # 2/3 ln((2/3) / 0.2) + 1/3 ln((1/3) / 0.3) = 0.802649 + 0.035120 = 0.837769
        # (renormalising the student to [0.4, 0.6] would give 0.144622)
        (1.0, 0.837769),
        # p_hat_T ∝ sqrt([0.5, 0.25]) = [0.585786, 0.414214]; q_T ∝ sqrt(q) = [0.262751, 0.321803, 0.415446]
        # 4 * (0.585786 ln(0.585786/0.262751) + 0.414214 ln(0.414214/0.321803)) = 2.296873
        (2.0, 2.296873),
    ],
)
def test_topk_hand_values(temperature: float, expected: float) -> None:
    # Token 1 lists the same top-2 in the other order; token 2 is padding with out-of-range ids.
    out = topk_distill_loss(
        TopkDistillInput(
            student_logits=torch.tensor([[Q_LOGITS, Q_LOGITS, NAN3]]),
            teacher_topk_ids=torch.tensor([[[0, 1], [1, 0], [99, -5]]]),
            teacher_topk_logprobs=torch.tensor(
                [[[math.log(0.5), math.log(0.25)], [math.log(0.25), math.log(0.5)], [float("nan")] * 2]]
            ),
            mask=torch.tensor([[True, True, False]]),
            temperature=temperature,
        )
    )
    assert out.loss.item() == pytest.approx(expected, abs=2e-6)


def test_topk_with_all_ids_equals_full() -> None:
    gen = torch.Generator().manual_seed(1)
    student = torch.randn(2, 3, 5, generator=gen)
    teacher = torch.randn(2, 3, 5, generator=gen)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    full = full_distill_loss(FullDistillInput(student, teacher, mask, temperature=1.5))
    topk_lp, topk_ids = torch.log_softmax(teacher, dim=-1).topk(5, dim=-1)
    topk = topk_distill_loss(TopkDistillInput(student, topk_ids, topk_lp, mask, temperature=1.5))
    assert full.loss.item() > 0.01
    assert topk.loss.item() == pytest.approx(full.loss.item(), rel=1e-5)


def test_sampled_on_policy_hand_values() -> None:
    # student [ln .5, ln .25, ln .2], teacher [ln .25, ln .5, ln .1] -> a = [-ln2, +ln2, -ln2]
    # loss = -mean(a * lp_s) = -(0.480453 - 0.960906 + 1.115577) / 3 = -0.211708
    # grad = -a / 3 = [0.231049, -0.231049, 0.231049]; reverse_kl = mean(-a) = ln2 / 3 = 0.231049
    student = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.2)]], requires_grad=True)
    teacher = torch.tensor([[math.log(0.25), math.log(0.5), math.log(0.1)]])
    out = sampled_distill_loss(SampledDistillInput(student, teacher, mask=torch.ones(1, 3)))
    out.loss.backward()
    assert student.grad is not None
    assert out.loss.item() == pytest.approx(-0.211708, abs=1e-6)
    torch.testing.assert_close(student.grad, torch.tensor([[0.231049, -0.231049, 0.231049]]))
    assert out.metrics["reverse_kl"] == pytest.approx(0.231049, abs=1e-6)
    assert out.metrics["overlap"] == pytest.approx((0.25 + 0.5 + 0.1) / 3, abs=1e-6)  # teacher mass
    assert out.metrics["kept_fraction"] == 1.0


def test_sampled_importance_weights_drop_out_of_range_tokens() -> None:
    # student [ln .5, ln .25, ln .2, ln .4], teacher [ln .25, ln .5, ln .1, ln .2]
    #   -> a = [-l, l, -l, -l], l = ln 2
    # w = [1.5, 3.0, 0.4, 0.6]: tokens 1 (w > 2) and 2 (w < 0.5) dropped; token 4 is padding.
    # loss = -(1.5 * -l * ln .5 + 0.6 * -l * ln .4) / 2 = -0.550877
    # grads: token0 -1.5 * -l / 2 = 0.519860; token3 -0.6 * -l / 2 = 0.207944; others 0.
    # reverse_kl over the 4 counted tokens: (l - l + l + l) / 4 = 0.346574; kept_fraction 2/4.
    s = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.2), math.log(0.4), float("nan")]])
    student = s.clone().requires_grad_()
    teacher = torch.tensor([[math.log(0.25), math.log(0.5), math.log(0.1), math.log(0.2), 1e4]])
    weights = torch.tensor([[1.5, 3.0, 0.4, 0.6, 1.0]])
    rollout = s - torch.log(weights)
    out = sampled_distill_loss(
        SampledDistillInput(student, teacher, mask=torch.tensor([[1, 1, 1, 1, 0]]), rollout_logprobs=rollout)
    )
    out.loss.backward()
    assert student.grad is not None
    assert out.loss.item() == pytest.approx(-0.550877, abs=1e-6)
    torch.testing.assert_close(student.grad, torch.tensor([[0.519860, 0.0, 0.0, 0.207944, 0.0]]))
    assert out.metrics["kept_fraction"] == 0.5
    assert out.metrics["reverse_kl"] == pytest.approx(0.346574, abs=1e-6)
    # the teacher's mass on the 4 counted tokens (the padding's 1e4 never enters)
    assert out.metrics["overlap"] == pytest.approx((0.25 + 0.5 + 0.1 + 0.2) / 4, abs=1e-6)
    assert out.metrics["n_tokens"] == 4


def test_sampled_gradient_is_reverse_kl_policy_gradient() -> None:
    # A real tiny student softmax(theta) over V = 3 at each of 4 positions; a fixed teacher.
    gen = torch.Generator().manual_seed(5)
    theta = torch.randn(4, 3, generator=gen)
    teacher_logp = torch.log_softmax(torch.randn(4, 3, generator=gen), dim=-1)
    tokens = torch.tensor([[0, 2, 1, 1], [2, 2, 0, 1]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])

    param = theta.clone().requires_grad_()
    lp_s = torch.log_softmax(param, dim=-1)[torch.arange(4), tokens]  # [2, 4]
    lp_t = teacher_logp[torch.arange(4), tokens]
    sampled_distill_loss(SampledDistillInput(lp_s, lp_t, mask=mask)).loss.backward()

    # Independent: -(1/N) sum_t (lp_t - lp_s) grad lp_s,
    # with grad_theta[t] log softmax(theta[t])[o] = onehot(o) - s_t.
    probs = torch.softmax(theta, dim=-1)
    log_s = torch.log_softmax(theta, dim=-1)
    expected = torch.zeros_like(theta)
    n = int(mask.sum())
    for i in range(2):
        for t in range(4):
            if mask[i, t]:
                o = int(tokens[i, t])
                score = -probs[t].clone()
                score[o] += 1.0
                expected[t] -= (teacher_logp[t, o] - log_s[t, o]) * score / n
    assert param.grad is not None
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(param.grad, expected, atol=1e-6, rtol=1e-5)


def test_sampled_expected_gradient_is_exact_reverse_kl_gradient() -> None:
    # Averaging the one-sample gradient over x ~ student gives grad KL(student || teacher) exactly.
    theta = torch.tensor([0.3, -0.8, 1.1])
    teacher_logp = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    probs = torch.softmax(theta, dim=0)
    expected_grad = torch.zeros(3)
    for x in range(3):
        param = theta.clone().requires_grad_()
        lp = torch.log_softmax(param, dim=0)[x].reshape(1, 1)
        sampled_distill_loss(
            SampledDistillInput(lp, teacher_logp[x].reshape(1, 1), torch.ones(1, 1))
        ).loss.backward()
        assert param.grad is not None
        expected_grad += probs[x] * param.grad
    param = theta.clone().requires_grad_()
    s = torch.softmax(param, dim=0)
    (s * (torch.log(s) - teacher_logp)).sum().backward()
    assert param.grad is not None
    torch.testing.assert_close(expected_grad, param.grad, atol=1e-6, rtol=1e-5)


def test_all_masked_gives_zero_loss_with_graph() -> None:
    student = torch.randn(1, 2, requires_grad=True)
    out = sampled_distill_loss(SampledDistillInput(student, torch.randn(1, 2), mask=torch.zeros(1, 2)))
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert out.metrics["kept_fraction"] == 0.0
    assert torch.equal(student.grad, torch.zeros(1, 2))

"""GRPO loss against hand-computed values: aggregation, REINFORCE gradient, clipping, k3, masking."""

from __future__ import annotations

import math

import pytest
import torch

from cascade.algo import GrpoLossInput, group_advantages, grpo_loss


def _lengths_mask(lengths: list[int], t: int) -> torch.Tensor:
    return torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def test_seed_002_token_aggregation_divides_by_235() -> None:
    # Seed 002: rewards [1, 1, 0, 0], lengths 50/80/45/60 (235 tokens), strictly on-policy.
    # A = +-0.8660239 (sample std). Ratio is 1, so loss = -sum_i A_i |o_i| / 235
    #   = -0.8660239 * (50 + 80 - 45 - 60) / 235 = -0.8660239 * 25 / 235 = -0.0921302,
    # and d loss / d logp[i, t] = -A_i / 235 = -+0.0036852 on real tokens, 0 on padding.
    lengths = [50, 80, 45, 60]
    adv = group_advantages(torch.tensor([[1.0, 1.0, 0.0, 0.0]]))[0]
    logprobs = (-torch.rand(4, 80) * 3).requires_grad_()
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logprobs,
            advantages=adv,
            mask=_lengths_mask(lengths, 80),
            group_ids=torch.zeros(4).long(),
        )
    )
    assert out.loss.item() == pytest.approx(-0.0921302, abs=1e-6)
    out.loss.backward()
    assert logprobs.grad is not None
    per_token = torch.tensor([-0.0036852, -0.0036852, 0.0036852, 0.0036852])
    for i, n in enumerate(lengths):
        torch.testing.assert_close(logprobs.grad[i, :n], per_token[i].expand(n), atol=1e-7, rtol=0)
        assert torch.equal(logprobs.grad[i, n:], torch.zeros(80 - n))
    assert out.metrics["n_tokens"] == 235
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)
    assert out.metrics["clip_fraction"] == 0.0


def _tiny_policy_case(
    group_ids: list[int], lengths: list[int], rewards_by_group: list[list[float]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A real tiny policy: position t draws a token from softmax(theta[t]) over V = 4."""
    gen = torch.Generator().manual_seed(7)
    t_max, vocab = max(lengths), 4
    theta = torch.randn(t_max, vocab, generator=gen)
    tokens = torch.randint(0, vocab, (len(lengths), t_max), generator=gen)
    adv = torch.cat([group_advantages(torch.tensor([r]))[0] for r in rewards_by_group])
    return theta, tokens, adv, _lengths_mask(lengths, t_max), torch.tensor(group_ids)


def _reinforce_gradient(
    theta: torch.Tensor, tokens: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor
) -> torch.Tensor:
    """Independent REINFORCE estimate, no autograd: grad_theta[t] log softmax(theta[t])[o] = onehot(o) - p_t.

    Per group g: -(1 / N_g) sum_{i in g} A_i sum_t grad log pi(o_i,t); then mean over groups.
    """
    probs = torch.softmax(theta, dim=-1)
    grad = torch.zeros_like(theta)
    group_list = sorted(set(groups.tolist()))
    for g in group_list:
        rows = [i for i in range(len(groups)) if groups[i] == g]
        n_g = sum(int(mask[i].sum()) for i in rows)
        for i in rows:
            for t in range(theta.shape[0]):
                if mask[i, t]:
                    score = -probs[t].clone()
                    score[tokens[i, t]] += 1.0
                    grad[t] -= adv[i] * score / n_g
    return grad / len(group_list)


@pytest.mark.parametrize(
    ("group_ids", "lengths", "rewards"),
    [
        ([0, 0, 0], [3, 1, 2], [[1.0, 0.0, 1.0]]),  # one group: -sum_i A_i sum_t grad / N_tokens
        ([4, 4, 9, 9], [2, 3, 3, 1], [[1.0, 0.0], [0.2, 0.9]]),  # two groups, then mean over groups
    ],
)
def test_on_policy_gradient_is_reinforce(
    group_ids: list[int], lengths: list[int], rewards: list[list[float]]
) -> None:
    theta, tokens, adv, mask, groups = _tiny_policy_case(group_ids, lengths, rewards)
    param = theta.clone().requires_grad_()
    logprobs = torch.log_softmax(param, dim=-1)[torch.arange(theta.shape[0]), tokens]  # [B, T]
    out = grpo_loss(GrpoLossInput(logprobs=logprobs, advantages=adv, mask=mask, group_ids=groups))
    out.loss.backward()
    assert param.grad is not None
    expected = _reinforce_gradient(theta, tokens, adv, mask, groups)
    assert expected.abs().max() > 1e-3  # the case is not degenerate
    torch.testing.assert_close(param.grad, expected, atol=1e-6, rtol=1e-5)


def test_sequence_and_token_aggregation_differ_on_unequal_lengths() -> None:
    # One group, lengths 1 and 3, A = [+1, -1], on-policy (ratio 1, per-token loss -A_i).
    # token:    (-1 * 1 + 1 * 3) / 4 = 0.5;  grad -A_i / 4 -> row0 -0.25, row1 +0.25.
    # sequence: mean(-1, +1) = 0.0;           grad -A_i / (|o_i| * 2) -> row0 -0.5, row1 +1/6.
    mask = _lengths_mask([1, 3], 3)
    expected = {"token": (0.5, [-0.25, 0.25]), "sequence": (0.0, [-0.5, 1.0 / 6.0])}
    for aggregation, (value, (g0, g1)) in expected.items():
        logprobs = torch.full((2, 3), -0.7, requires_grad=True)
        out = grpo_loss(
            GrpoLossInput(
                logprobs=logprobs,
                advantages=torch.tensor([1.0, -1.0]),
                mask=mask,
                group_ids=torch.tensor([0, 0]),
                aggregation=aggregation,  # type: ignore[arg-type]
            )
        )
        out.loss.backward()
        assert logprobs.grad is not None
        assert out.loss.item() == pytest.approx(value, abs=1e-7)
        torch.testing.assert_close(logprobs.grad, torch.tensor([[g0, 0.0, 0.0], [g1, g1, g1]]))


def test_token_aggregation_averages_groups_and_skips_empty_ones() -> None:
    # Group 0: one row, 2 tokens, A = +1 -> group loss -2/2 = -1.
    # Group 1: one row, 4 tokens, A = -0.5 -> group loss +2/4 = +0.5.
    # Group 2: fully masked (dropped sample) -> not counted. Mean over groups: (-1 + 0.5) / 2 = -0.25.
    # (A flat token mean over the batch would give (-2 + 2) / 6 = 0.)
    logprobs = torch.zeros(3, 4, requires_grad=True)
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logprobs,
            advantages=torch.tensor([1.0, -0.5, 5.0]),
            mask=_lengths_mask([2, 4, 0], 4),
            group_ids=torch.tensor([0, 1, 2]),
        )
    )
    assert out.loss.item() == pytest.approx(-0.25)
    assert out.metrics["n_tokens"] == 6


def test_clipping_stale_tokens() -> None:
    # One group, N = 4 tokens, eps_low 0.2, eps_high 0.28, ratio = exp(logp - old).
    # row0 (A=+1): ratio 1.5 -> clipped at 1.28, loss -1.28, grad 0 | ratio 1.0 -> loss -1.0, grad -1/4
    # row1 (A=-1): ratio 0.5 -> clipped at 0.8, loss +0.8, grad 0  | ratio 1.5 -> unclipped
    #              (min(-1.5, -1.28) = -1.5) loss +1.5, grad -ratio * A / 4 = +0.375
    # loss = (-1.28 - 1.0 + 0.8 + 1.5) / 4 = 0.005; clip_fraction 2/4; ratio_mean 4.5/4 = 1.125.
    ratios = torch.tensor([[1.5, 1.0], [0.5, 1.5]])
    logprobs = torch.full((2, 2), math.log(0.4), requires_grad=True)
    old = logprobs.detach() - torch.log(ratios)
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=torch.tensor([1.0, -1.0]),
            mask=torch.ones(2, 2),
            group_ids=torch.tensor([0, 0]),
            clip_eps_low=0.2,
            clip_eps_high=0.28,
        )
    )
    out.loss.backward()
    assert logprobs.grad is not None
    assert out.loss.item() == pytest.approx(0.005, abs=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.25], [0.0, 0.375]]))
    assert out.metrics["clip_fraction"] == pytest.approx(0.5)
    assert out.metrics["ratio_mean"] == pytest.approx(1.125, abs=1e-6)


def test_k3_kl_penalty() -> None:
    # A = 0 (flat group) so only the penalty acts. kl_coef 0.1, one row, 2 tokens.
    # token0: logp ln 0.5, ref ln 0.25: k3 = 0.5 - ln 0.5 - 1 = 0.193147; d/dlogp = 1 - 0.5 = 0.5
    # token1: logp ln 0.25, ref ln 0.5: k3 = 2 - ln 2 - 1 = 0.306853;     d/dlogp = 1 - 2 = -1
    # loss = 0.1 * (0.193147 + 0.306853) / 2 = 0.025; kl metric 0.25; grads 0.1 * [0.5, -1] / 2.
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logprobs,
            ref_logprobs=ref,
            advantages=torch.tensor([0.0]),
            mask=torch.ones(1, 2),
            group_ids=torch.tensor([0]),
            kl_coef=0.1,
        )
    )
    out.loss.backward()
    assert logprobs.grad is not None
    assert out.loss.item() == pytest.approx(0.025, abs=1e-6)
    assert out.metrics["kl"] == pytest.approx(0.25, abs=1e-6)
    assert out.metrics["pg_loss"] == 0.0
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.025, -0.05]]))
    with pytest.raises(ValueError, match="ref_logprobs"):
        GrpoLossInput(
            logprobs=logprobs,
            advantages=torch.tensor([0.0]),
            mask=torch.ones(1, 2),
            group_ids=torch.tensor([0]),
            kl_coef=0.1,
        )


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_padding_garbage_changes_nothing(aggregation: str) -> None:
    gen = torch.Generator().manual_seed(3)
    b, t = 4, 6
    mask = _lengths_mask([6, 2, 4, 0], t)
    base = -torch.rand(b, t, generator=gen) * 2
    old = base - 0.3 * torch.randn(b, t, generator=gen)
    ref = base - 0.3 * torch.randn(b, t, generator=gen)
    adv = torch.tensor([0.9, -0.4, 1.3, 0.0])

    def run(lp: torch.Tensor, old_lp: torch.Tensor, ref_lp: torch.Tensor, a: torch.Tensor):
        leaf = lp.clone().requires_grad_()
        out = grpo_loss(
            GrpoLossInput(
                logprobs=leaf,
                old_logprobs=old_lp,
                ref_logprobs=ref_lp,
                advantages=a,
                mask=mask,
                group_ids=torch.tensor([0, 0, 1, 1]),
                aggregation=aggregation,  # type: ignore[arg-type]
                kl_coef=0.05,
            )
        )
        out.loss.backward()
        return out, leaf.grad

    clean_out, clean_grad = run(base, old, ref, adv)
    pad = ~mask
    garbage = torch.tensor([1e4, float("nan"), float("-inf"), -1e4, float("inf"), 3.0]).repeat(b, 1)
    dirty_out, dirty_grad = run(
        torch.where(pad, garbage, base),
        torch.where(pad, garbage.flip(1), old),
        torch.where(pad, garbage.roll(1, 1), ref),
        torch.tensor([0.9, -0.4, 1.3, float("nan")]),  # the fully masked row's advantage is garbage too
    )
    assert torch.isfinite(clean_out.loss)
    assert dirty_out.loss.item() == clean_out.loss.item()
    assert torch.equal(dirty_grad, clean_grad)
    assert torch.equal(clean_grad[pad], torch.zeros(int(pad.sum())))
    assert dirty_out.metrics == clean_out.metrics


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="mask"):
        GrpoLossInput(
            logprobs=torch.zeros(2, 3),
            advantages=torch.zeros(2),
            mask=torch.ones(2, 4),
            group_ids=torch.zeros(2).long(),
        )
    with pytest.raises(ValueError, match="advantages"):
        GrpoLossInput(
            logprobs=torch.zeros(2, 3),
            advantages=torch.zeros(2, 1),
            mask=torch.ones(2, 3),
            group_ids=torch.zeros(2).long(),
        )

"""Group-relative advantages: per group, sample std, exact zeros for flat groups."""

from __future__ import annotations

import pytest
import torch

from cascade.algo import group_advantages, zero_variance_mask


def test_seed_002_worked_example_uses_sample_std() -> None:
    # Seed 002: rewards [1, 1, 0, 0]; mean 0.5; sample std sqrt(((0.5^2) * 4) / 3) = 0.57735;
    # 0.5 / (0.57735 + 1e-6) = 0.8660239 (population std 0.5 would give 1.0).
    adv = group_advantages(torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    expected = torch.tensor([[0.8660239, 0.8660239, -0.8660239, -0.8660239]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_normalised_per_group_not_per_batch() -> None:
    # Group 0 [0, 0.2, 0.2]: mean 0.133333, deviations [-0.133333, 0.066667, 0.066667],
    #   sample var (0.017778 + 2 * 0.004444) / 2 = 0.013333, std 0.115470 -> [-1.154701, 0.577350, 0.577350].
    # Group 1 [1, 3, 5]: mean 3, sample std sqrt((4 + 0 + 4) / 2) = 2 -> [-1, 0, 1].
    # A batch-wide normalisation would give every completion of group 0 a negative advantage.
    adv = group_advantages(torch.tensor([[0.0, 0.2, 0.2], [1.0, 3.0, 5.0]]))
    torch.testing.assert_close(
        adv, torch.tensor([[-1.154701, 0.577350, 0.577350], [-1.0, 0.0, 1.0]]), atol=2e-5, rtol=0
    )


def test_flat_group_is_exactly_zero() -> None:
    # In float32, mean([0.9, 0.9, 0.9]) - 0.9 = 5.96e-8, and / (0 + 1e-6) that would be a 0.06 advantage:
    # the flat-group mask, not the arithmetic, must make it 0.
    rewards = torch.tensor([[0.9, 0.9, 0.9], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    adv = group_advantages(rewards)
    assert torch.equal(adv[:2], torch.zeros(2, 3))
    assert adv[2].abs().sum() > 0
    assert zero_variance_mask(rewards).tolist() == [True, True, False]


def test_integer_rewards_and_shape_errors() -> None:
    adv = group_advantages(torch.tensor([[1, 0]]))
    # [1, 0]: mean 0.5, sample std sqrt(0.5) = 0.707107 -> +-0.707106
    torch.testing.assert_close(adv, torch.tensor([[0.707106, -0.707106]]), atol=2e-5, rtol=0)
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0], [0.0]]))


# --------------------------------------------------------------------------- failed verifiers


def test_failed_verifier_is_out_of_the_group_statistics() -> None:
    # [1, 0, err, err]: over the two valid samples, mean 0.5, sample std sqrt((0.25 + 0.25) / 1)
    # = 0.707107 -> 0.5 / 0.707107 = +-0.707106; the failed ones get exactly 0. Counting them at
    # the group mean (the unmasked behaviour) gives std sqrt(0.5 / 3) = 0.408248 -> +-1.224742.
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5]])
    valid = torch.tensor([[True, True, False, False]])
    adv = group_advantages(rewards, valid)
    torch.testing.assert_close(adv, torch.tensor([[0.707106, -0.707106, 0.0, 0.0]]), atol=2e-6, rtol=0)
    torch.testing.assert_close(
        group_advantages(rewards), torch.tensor([[1.224742, -1.224742, 0.0, 0.0]]), atol=5e-6, rtol=0
    )


def test_failed_verifier_rewards_are_never_read() -> None:
    # The placeholder of a failed sample may be anything, NaN included: same advantages.
    # [1, 1, 0, err]: mean 2/3, sample std sqrt((1/9 + 1/9 + 4/9) / 2) = 0.577350
    # -> (1/3) / 0.577350 = 0.577350 and (-2/3) / 0.577350 = -1.154700.
    valid = torch.tensor([[True, True, True, False]])
    expected = torch.tensor([[0.577350, 0.577350, -1.154700, 0.0]])
    for placeholder in (0.0, 1.0, 123.0, float("nan")):
        adv = group_advantages(torch.tensor([[1.0, 1.0, 0.0, placeholder]]), valid)
        torch.testing.assert_close(adv, expected, atol=2e-6, rtol=0)


def test_groups_with_fewer_than_two_valid_samples_get_zero() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    valid = torch.tensor(
        [
            [True, False, False, False],  # one valid sample: no spread to normalise by
            [False, False, False, False],  # none valid
            [True, True, False, False],  # two valid, both 0: flat
        ]
    )
    assert torch.equal(group_advantages(rewards, valid), torch.zeros(3, 4))
    assert zero_variance_mask(rewards, valid).tolist() == [True, True, True]
    # Unmasked, the placeholders would count as rewards and no group would be flat.
    assert zero_variance_mask(rewards).tolist() == [False, False, False]


def test_mixed_batch_masks_only_where_asked() -> None:
    # Group 0 all valid [1, 0, 0, 0]: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    #   -> [1.5, -0.5, -0.5, -0.5].
    # Group 1 [0.2, err, 0.8, 0.5]: mean 0.5, sample std sqrt((0.09 + 0.09 + 0) / 2) = 0.3
    #   -> [-1, 0, 1, 0].
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.2, 9.0, 0.8, 0.5]])
    valid = torch.tensor([[True, True, True, True], [True, False, True, True]])
    adv = group_advantages(rewards, valid)
    torch.testing.assert_close(
        adv, torch.tensor([[1.5, -0.5, -0.5, -0.5], [-1.0, 0.0, 1.0, 0.0]]), atol=1e-5, rtol=0
    )
    assert zero_variance_mask(rewards, valid).tolist() == [False, False]
    torch.testing.assert_close(group_advantages(rewards[:1], valid[:1]), group_advantages(rewards[:1]))


def test_valid_mask_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="valid must match"):
        group_advantages(torch.zeros(2, 4), torch.ones(8, dtype=torch.bool))

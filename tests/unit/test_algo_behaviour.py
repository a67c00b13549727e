"""Behaviour-policy correction against hand-computed values: the weights and kept tokens of each
mode, the mismatch sums, masked garbage, the settings' bounds, and the GRPO loss's use of them
(the weight on the policy-gradient term, dropped tokens out, the normalisers unchanged)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from cascade.algo import BehaviourSettings, GrpoLossInput, behaviour_weights, grpo_loss
from cascade.algo.grpo import GrpoNorms
from cascade.config import GrpoConfig

LN3 = math.log(3.0)
LN15 = math.log(1.5)
LN04 = math.log(0.4)


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Learner log-probs, behaviour log-probs and mask with these log-ratios `logp - behaviour`:
    row 0: ln 3 (ratio 3), ln 1.5, ln 0.4 (ratio 0.4), [masked]
    row 1: 1.0, 1.5 (summed 2.5), [masked], [masked]
    row 2: 0.3, -0.2, [masked], [masked]
    row 3: 1.5, -1.5, -0.1, 0.05 (summed -0.05: large tokens, small sum)"""
    diff = torch.tensor(
        [
            [LN3, LN15, LN04, 0.0],
            [1.0, 1.5, 0.0, 0.0],
            [0.3, -0.2, 0.0, 0.0],
            [1.5, -1.5, -0.1, 0.05],
        ]
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    logp = -torch.linspace(0.5, 3.0, 16).view(4, 4)
    return logp, logp - diff, mask


def test_tis_truncates_every_counted_token_at_high() -> None:
    logp, behav, mask = _case()
    out = behaviour_weights(logp, behav, mask, BehaviourSettings(mode="tis"))
    e = math.exp
    expected = torch.tensor(
        [
            [2.0, 1.5, 0.4, 0.0],  # ratio 3 -> 2 (truncated); 1.5; 0.4 (no lower truncation)
            [2.0, 2.0, 0.0, 0.0],  # e^1 = 2.72 and e^1.5 = 4.48 -> 2
            [e(0.3), e(-0.2), 0.0, 0.0],
            [2.0, e(-1.5), e(-0.1), e(0.05)],
        ]
    )
    torch.testing.assert_close(out.weight, expected)
    assert torch.equal(out.kept, mask)
    assert float(out.dropped) == 0.0


def test_masked_drops_tokens_outside_the_bounds() -> None:
    logp, behav, mask = _case()
    out = behaviour_weights(logp, behav, mask, BehaviourSettings(mode="masked"))
    e = math.exp
    # out of [0.5, 2]: ratio 3, 0.4, e^1 = 2.72, e^1.5 = 4.48 (twice), e^-1.5 = 0.22 -> 6 dropped
    expected = torch.tensor(
        [
            [0.0, 1.5, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [e(0.3), e(-0.2), 0.0, 0.0],
            [0.0, 0.0, e(-0.1), e(0.05)],
        ]
    )
    torch.testing.assert_close(out.weight, expected)
    kept = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(out.kept, kept)
    assert float(out.dropped) == 6.0 and float(out.out_of_range) == 6.0


def test_seq_mask_drops_whole_sequences_by_their_summed_log_ratio() -> None:
    logp, behav, mask = _case()
    out = behaviour_weights(logp, behav, mask, BehaviourSettings(mode="seq_mask", seq_threshold=2.0))
    # summed log-ratios: row 0 ln(3 * 1.5 * 0.4) = ln 1.8 = 0.588 (kept); row 1 2.5 > 2 (dropped);
    # row 2 0.1 (kept); row 3 -0.05 (kept, its tokens truncated at 2 as tis does)
    e = math.exp
    expected = torch.tensor(
        [
            [2.0, 1.5, 0.4, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [e(0.3), e(-0.2), 0.0, 0.0],
            [2.0, e(-1.5), e(-0.1), e(0.05)],
        ]
    )
    torch.testing.assert_close(out.weight, expected)
    assert out.kept[1].tolist() == [False] * 4 and torch.equal(out.kept[[0, 2, 3]], mask[[0, 2, 3]])
    assert float(out.dropped) == 2.0
    tight = behaviour_weights(logp, behav, mask, BehaviourSettings(mode="seq_mask", seq_threshold=0.5))
    assert tight.kept.any(dim=1).tolist() == [False, False, True, True]  # row 0's 0.588 > 0.5 too


def test_mismatch_sums_and_off() -> None:
    logp, behav, mask = _case()
    out = behaviour_weights(logp, behav, mask, BehaviourSettings())  # off
    assert torch.equal(out.weight, mask.float()) and torch.equal(out.kept, mask)
    # |diff| over the 11 counted tokens
    total = LN3 + LN15 - LN04 + 1.0 + 1.5 + 0.3 + 0.2 + 1.5 + 1.5 + 0.1 + 0.05
    assert float(out.abs_diff_sum) == pytest.approx(total, rel=1e-6)
    assert float(out.abs_diff_max) == pytest.approx(1.5, rel=1e-6)
    assert float(out.out_of_range) == 6.0  # counted with the correction off too
    assert float(out.dropped) == 0.0
    narrow = behaviour_weights(logp, behav, mask, BehaviourSettings(low=0.9, high=1.1))
    assert float(narrow.out_of_range) == 9.0  # all but -0.1 (0.905) and 0.05 (1.051)


@pytest.mark.parametrize("mode", ["off", "tis", "masked", "seq_mask"])
def test_masked_positions_holding_inf_or_nan_change_nothing(mode: str) -> None:
    logp, behav, mask = _case()
    settings = BehaviourSettings(mode=mode)  # type: ignore[arg-type]
    clean = behaviour_weights(logp, behav, mask, settings)
    garbage = torch.tensor([float("inf"), float("nan"), float("-inf"), 1e30])
    pad = ~mask
    dirty = behaviour_weights(
        torch.where(pad, garbage, logp), torch.where(pad, garbage.flip(0), behav), mask, settings
    )
    for name in ("weight", "kept", "abs_diff_sum", "out_of_range", "dropped", "abs_diff_max"):
        assert torch.equal(getattr(clean, name), getattr(dirty, name)), name


def test_settings_and_config_bounds() -> None:
    cfg = GrpoConfig().behaviour_correction
    assert (cfg.mode, cfg.low, cfg.high, cfg.seq_threshold) == ("off", 0.5, 2.0, 2.0)
    on = GrpoConfig.model_validate({"behaviour_correction": {"mode": "masked", "low": 0.8, "high": 1.25}})
    assert on.behaviour_correction.mode == "masked" and on.behaviour_correction.high == 1.25
    for bad in (
        {"low": 0.0},
        {"low": 1.2},
        {"high": 0.9},
        {"seq_threshold": 0.0},
        {"mode": "icepop"},
        {"hi": 2.0},
    ):
        with pytest.raises(ValidationError, match="behaviour_correction"):
            GrpoConfig.model_validate({"behaviour_correction": bad})
    for kwargs in ({"low": 0.0}, {"low": 1.5}, {"high": 0.5}, {"seq_threshold": -1.0}, {"mode": "x"}):
        with pytest.raises(ValueError):
            BehaviourSettings(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- in the GRPO loss


def _loss(
    mode: str,
    logp: torch.Tensor,
    behav: torch.Tensor | None,
    mask: torch.Tensor,
    adv: torch.Tensor,
    **kw: object,
) -> tuple[float, torch.Tensor, dict[str, float]]:
    leaf = logp.clone().requires_grad_()
    out = grpo_loss(
        GrpoLossInput(
            logprobs=leaf,
            advantages=adv,
            mask=mask,
            group_ids=torch.tensor([0, 0, 1, 1]),
            behaviour_logprobs=behav,
            behaviour=BehaviourSettings(mode=mode),  # type: ignore[arg-type]
            **kw,  # type: ignore[arg-type]
        )
    )
    out.loss.backward()
    assert leaf.grad is not None
    return float(out.loss.detach()), leaf.grad, out.metrics


def test_the_loss_weights_the_policy_term_and_keeps_the_normalisers() -> None:
    # Groups: rows 0-1 (3 + 2 = 5 counted tokens), rows 2-3 (2 + 4 = 6); token aggregation, so
    # d loss / d logp = -A_i * w_t / (N_group * 2 groups); ratio 1 (the learner's own old policy).
    logp, behav, mask = _case()
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    n = torch.tensor([5.0, 5.0, 6.0, 6.0]).unsqueeze(1) * 2
    for mode in ("tis", "masked", "seq_mask"):
        w = behaviour_weights(logp, behav, mask, BehaviourSettings(mode=mode)).weight  # type: ignore[arg-type]
        loss, grad, metrics = _loss(mode, logp, behav, mask, adv)
        torch.testing.assert_close(grad, -adv.unsqueeze(1) * w / n)
        assert loss == pytest.approx(float((-adv.unsqueeze(1) * w / n).sum()), abs=1e-6)
        assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clip_fraction"] == 0.0
        assert metrics["behaviour_weight_mean"] == pytest.approx(float(w.sum()) / 11, rel=1e-6)
    # masked: 6 of 11 counted tokens dropped (the mismatch metrics are the sums over 11)
    _, _, metrics = _loss("masked", logp, behav, mask, adv)
    assert metrics["behaviour_dropped_frac"] == pytest.approx(6 / 11)
    assert metrics["mismatch_out_frac"] == pytest.approx(6 / 11)
    assert metrics["mismatch_max"] == pytest.approx(1.5, rel=1e-6)
    total = LN3 + LN15 - LN04 + 1.0 + 1.5 + 0.3 + 0.2 + 1.5 + 1.5 + 0.1 + 0.05
    assert metrics["mismatch_mean"] == pytest.approx(total / 11, rel=1e-6)


def test_off_reports_the_mismatch_and_changes_nothing_else() -> None:
    logp, behav, mask = _case()
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    old = logp - 0.3
    for old_lp in (None, old):  # on-policy and stale
        base_loss, base_grad, base_metrics = _loss("off", logp, None, mask, adv, old_logprobs=old_lp)
        loss, grad, metrics = _loss("off", logp, behav, mask, adv, old_logprobs=old_lp)
        assert loss == base_loss and torch.equal(grad, base_grad)  # bit for bit
        assert {k: v for k, v in metrics.items() if k in base_metrics} == base_metrics
        assert set(metrics) - set(base_metrics) == {
            "mismatch_mean",
            "mismatch_max",
            "mismatch_out_frac",
            "behaviour_dropped_frac",
        }
        assert metrics["behaviour_dropped_frac"] == 0.0 and metrics["mismatch_out_frac"] == pytest.approx(
            6 / 11
        )


def test_a_dropped_token_leaves_the_k3_term_too() -> None:
    logp, behav, mask = _case()
    ref = logp + 0.4  # k3 = e^0.4 - 0.4 - 1 = 0.0918 on every token, d/dlogp = 1 - e^0.4
    adv = torch.zeros(4)
    _, grad, metrics = _loss("masked", logp, behav, mask, adv, ref_logprobs=ref, kl_coef=0.1)
    kept = behaviour_weights(logp, behav, mask, BehaviourSettings(mode="masked")).kept
    n = torch.tensor([5.0, 5.0, 6.0, 6.0]).unsqueeze(1) * 2
    expected = torch.where(kept, 0.1 * (1 - math.exp(0.4)) / n, torch.zeros(4, 4))
    torch.testing.assert_close(grad, expected)
    assert metrics["kl"] == pytest.approx(math.exp(0.4) - 1.4, rel=1e-5)  # over all counted tokens


def test_the_micro_batch_part_is_the_one_pass_value() -> None:
    logp, behav, mask = _case()
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    for mode in ("off", "tis", "masked", "seq_mask"):
        whole_loss, whole_grad, whole = _loss(mode, logp, behav, mask, adv)
        norms = GrpoNorms(torch.tensor([5.0, 5.0, 6.0, 6.0]), torch.tensor(2.0), torch.tensor(11.0))
        sums: dict[str, float] = {}
        grads = []
        loss = 0.0
        for lo, hi in ((0, 1), (1, 3), (3, 4)):
            leaf = logp[lo:hi].clone().requires_grad_()
            out = grpo_loss(
                GrpoLossInput(
                    logprobs=leaf,
                    advantages=adv[lo:hi],
                    mask=mask[lo:hi],
                    group_ids=torch.tensor([0, 0, 1, 1])[lo:hi],
                    behaviour_logprobs=behav[lo:hi],
                    behaviour=BehaviourSettings(mode=mode),  # type: ignore[arg-type]
                    norms=norms.rows(lo, hi),
                )
            )
            out.loss.backward()
            assert leaf.grad is not None
            grads.append(leaf.grad)
            loss += float(out.loss)
            for k, v in out.metrics.items():
                sums[k] = max(sums.get(k, v), v) if k == "mismatch_max" else sums.get(k, 0.0) + v
        assert loss == pytest.approx(whole_loss, abs=1e-6)
        torch.testing.assert_close(torch.cat(grads), whole_grad)
        assert sums.keys() == whole.keys()
        for k in whole:
            assert sums[k] == pytest.approx(whole[k], rel=1e-6, abs=1e-7), (mode, k)


def test_input_checks() -> None:
    logp, behav, mask = _case()
    base = {"logprobs": logp, "advantages": torch.zeros(4), "mask": mask, "group_ids": torch.zeros(4).long()}
    with pytest.raises(ValueError, match="needs behaviour_logprobs"):
        GrpoLossInput(**base, behaviour=BehaviourSettings(mode="tis"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not old_logprobs"):
        GrpoLossInput(
            **base,  # type: ignore[arg-type]
            old_logprobs=behav,
            behaviour_logprobs=behav,
            behaviour=BehaviourSettings(mode="tis"),
        )
    with pytest.raises(ValueError, match="behaviour_logprobs has shape"):
        GrpoLossInput(**base, behaviour_logprobs=behav[:, :3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reduce_max"):
        GrpoLossInput(**base, behaviour_logprobs=behav, reduce=lambda t: t)  # type: ignore[arg-type]

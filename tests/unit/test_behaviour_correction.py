"""The behaviour-policy correction through the RL term, on the random tiny model: behaviour
log-probs are the learner's own plus a perturbation on chosen tokens, so every weight, drop and
mismatch number is known by hand.

(a) `masked` drops the perturbed tokens: the gradient is that of the same rows with those tokens
    out of the mask (under the step's normalisers, which a drop leaves as they are);
(b) `tis` weights are the ratio truncated at `high`;
(c) `seq_mask` drops the perturbed sequence: the gradient is that of the plan with its
    advantage 0;
(d) the mismatch metrics are the hand values;
(e) in micro-batches each mode makes the one-pass loss, gradient and metrics (`mismatch_max`, a
    maximum, included);
(f) `off` with behaviour log-probs equal to the learner's is today's on-policy update bit for bit;
and `plan_rl` carries the engine's log-probs as the correction needs them.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rl_plans import random_plan

from cascade.algo import BehaviourSettings, GrpoLossInput, GrpoNorms, grpo_loss, grpo_normalisers
from cascade.config import GrpoConfig
from cascade.domains.base import OK, WRONG_ANSWER, Problem, RewardVerdict
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logprobs
from cascade.engine.microbatch import MicroBatching
from cascade.model.loading import load_policy
from cascade.parallel.world import World
from cascade.rollout.requests import RolloutBatch
from cascade.runner.rl import RlPlan, plan_rl, rl_backward, rl_loss
from cascade.runner.term_sums import TermSums

PERTURBED = [(0, 1), (4, 0), (7, 1), (10, 0)]
"""(row, token) given behaviour log-prob `own + 2.0`: ratio e^-2 = 0.135, below `low` 0.5."""
HIGH = [(2, 0), (8, 1)]
"""(row, token) given `own - ln 3`: ratio 3, above `high` 2."""
OFF = BehaviourSettings()


@pytest.fixture(scope="module")
def model(random_tiny_model: Path, torch_one_thread: None) -> torch.nn.Module:
    return load_policy(random_tiny_model).model


def _plan() -> RlPlan:
    return random_plan(5)


def _own(model: torch.nn.Module, plan: RlPlan) -> list[list[float]]:
    """The learner's log-probs of each row's tokens, as the one-pass loss computes them."""
    sb = build_batch(plan.prompt_ids, plan.completion_ids, 0)
    with torch.no_grad():
        lp = completion_logprobs(model, sb, plan.temperature)
    return [lp[i, : len(c)].tolist() for i, c in enumerate(plan.completion_ids)]


def _perturbed(own: list[list[float]], shifts: dict[tuple[int, int], float]) -> list[list[float]]:
    rows = [list(r) for r in own]
    for (i, t), d in shifts.items():
        rows[i][t] += d
    return rows


def _cfg(mode: str, **kw: float) -> GrpoConfig:
    return GrpoConfig.model_validate({"behaviour_correction": {"mode": mode, **kw}})


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _one_pass(
    model: torch.nn.Module, plan: RlPlan, cfg: GrpoConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
    model.zero_grad(set_to_none=True)
    term = rl_loss(model, plan, cfg, pad_id=0)
    assert term.loss is not None
    term.loss.backward()
    return term.loss.detach(), _grads(model), term.metrics


def _cut(
    model: torch.nn.Module, plan: RlPlan, cfg: GrpoConfig, batching: MicroBatching
) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    model.zero_grad(set_to_none=True)
    value, metrics = rl_backward(
        model, plan, cfg, pad_id=0, batching=batching, autocast=contextlib.nullcontext
    )
    assert value is not None
    return value, _grads(model), metrics


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rel: float = 1e-5) -> None:
    assert set(a) == set(b)
    for k in a:
        scale = float(a[k].abs().max()) or 1.0
        assert float((a[k] - b[k]).abs().max()) <= rel * scale, k


def _n_tokens(plan: RlPlan) -> int:
    return sum(len(c) for c in plan.completion_ids)


# ---------------------------------------------------------------- (a) masked


def test_masked_is_the_gradient_without_the_dropped_tokens(model: torch.nn.Module) -> None:
    plan = _plan()
    own = _own(model, plan)
    behaviour = _perturbed(own, {p: 2.0 for p in PERTURBED})
    sb = build_batch(plan.prompt_ids, plan.completion_ids, 0)
    adv, groups = torch.tensor(plan.advantages), torch.tensor(plan.group_ids)
    full = sb.completion_mask
    fewer = full.clone()
    for i, t in PERTURBED:
        fewer[i, t] = 0.0

    def run(
        mask: torch.Tensor,
        behav: torch.Tensor | None = None,
        settings: BehaviourSettings = OFF,
        norms: GrpoNorms | None = None,
    ) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = grpo_loss(
            GrpoLossInput(
                logprobs=completion_logprobs(model, sb, 1.0),
                advantages=adv,
                mask=mask,
                group_ids=groups,
                behaviour_logprobs=behav,
                behaviour=settings,
                norms=norms,
            )
        )
        out.loss.backward()
        return float(out.loss.detach()), _grads(model)

    behav = torch.zeros(full.shape)
    for i, row in enumerate(behaviour):
        behav[i, : len(row)] = torch.tensor(row)
    dropped_loss, dropped = run(full, behav, BehaviourSettings(mode="masked"))
    # the same rows, the perturbed tokens out of the mask, the step's normalisers from all of them
    removed_loss, removed = run(fewer, norms=grpo_normalisers(full.sum(dim=1), groups, "token"))
    assert dropped_loss == pytest.approx(removed_loss, abs=1e-6)
    _close(dropped, removed)
    # and the plan's one-pass term is that loss
    loss, grads, metrics = _one_pass(model, replace(plan, behaviour_logprobs=behaviour), _cfg("masked"))
    assert float(loss) == pytest.approx(dropped_loss, abs=1e-6)
    _close(grads, dropped)
    assert metrics["grpo_behaviour_dropped_frac"] == pytest.approx(len(PERTURBED) / _n_tokens(plan))
    # a drop is not a no-op: without it the gradient differs
    _, plain, _ = _one_pass(model, plan, GrpoConfig())
    assert any(float((plain[k] - grads[k]).abs().max()) > 1e-4 for k in grads)


def test_masked_drops_a_whole_row_as_a_zero_advantage_would(model: torch.nn.Module) -> None:
    plan = _plan()
    own = _own(model, plan)
    behaviour = _perturbed(own, {(5, t): 2.0 for t in range(len(own[5]))})
    loss, grads, _ = _one_pass(model, replace(plan, behaviour_logprobs=behaviour), _cfg("masked"))
    advantages = list(plan.advantages)
    advantages[5] = 0.0
    ref_loss, ref, _ = _one_pass(model, replace(plan, advantages=advantages), GrpoConfig())
    assert float(loss) == pytest.approx(float(ref_loss), abs=1e-6)
    _close(grads, ref)


# ---------------------------------------------------------------- (b) tis


def test_tis_weights_are_the_ratio_truncated_at_high(model: torch.nn.Module) -> None:
    plan = _plan()
    own = _own(model, plan)
    shifts = {p: -math.log(3.0) for p in HIGH} | {p: 0.3 for p in PERTURBED}
    behaviour = _perturbed(own, shifts)
    loss, grads, metrics = _one_pass(model, replace(plan, behaviour_logprobs=behaviour), _cfg("tis"))
    # by hand: loss = sum_t c_t * ratio_t, ratio 1 (the learner's own old policy) with gradient
    # grad logp_t, so loss = sum_t c_t and gradient = grad sum_t c_t * logp_t, where
    # c_t = -A_i * w_t / (N_group * n_groups); w = min(3, 2) = 2 at HIGH, e^-0.3 at PERTURBED, else 1
    sb = build_batch(plan.prompt_ids, plan.completion_ids, 0)
    m = sb.completion_mask
    w = m.clone()
    for p in HIGH:
        w[p] = 2.0
    for p in PERTURBED:
        w[p] = math.exp(-0.3)
    groups = torch.tensor(plan.group_ids)
    n_group = torch.zeros(4).index_add(0, groups, m.sum(dim=1))[groups]
    c = -torch.tensor(plan.advantages).unsqueeze(1) * w / (n_group.unsqueeze(1) * 4)
    model.zero_grad(set_to_none=True)
    logp = completion_logprobs(model, sb, 1.0)
    by_hand = (c * logp).sum()
    by_hand.backward()
    assert float(loss) == pytest.approx(float(c.sum()), abs=1e-6)
    _close(grads, _grads(model))
    n = _n_tokens(plan)
    assert metrics["grpo_behaviour_weight_mean"] == pytest.approx(float(w.sum()) / n, rel=1e-5)
    assert metrics["grpo_behaviour_dropped_frac"] == 0.0
    # `high` is the setting's: at 4 the ratio 3 goes through whole
    _, _, wide = _one_pass(model, replace(plan, behaviour_logprobs=behaviour), _cfg("tis", high=4.0))
    extra = len(HIGH) * (3.0 - 2.0) / n
    assert wide["grpo_behaviour_weight_mean"] == pytest.approx(float(w.sum()) / n + extra, rel=1e-5)


# ---------------------------------------------------------------- (c) seq_mask


def test_seq_mask_gives_the_perturbed_sequence_no_gradient(model: torch.nn.Module) -> None:
    plan = _plan()
    own = _own(model, plan)
    # row 6: summed log-ratio -2.5 (dropped); row 9: -1.5 and +1.5 that cancel (kept, with the
    # weights e^-1.5 and e^1.5 -> 2, as `tis` gives them)
    behaviour = _perturbed(own, {(6, 0): 1.25, (6, 1): 1.25, (9, 0): 1.5, (9, 1): -1.5})
    loss, grads, metrics = _one_pass(model, replace(plan, behaviour_logprobs=behaviour), _cfg("seq_mask"))
    # the same as `tis` on the plan with row 6's advantage 0 (the normalisers unchanged)
    advantages = list(plan.advantages)
    advantages[6] = 0.0
    kept_only = _perturbed(own, {(9, 0): 1.5, (9, 1): -1.5})
    ref_loss, ref, _ = _one_pass(
        model, replace(plan, advantages=advantages, behaviour_logprobs=kept_only), _cfg("tis")
    )
    assert float(loss) == pytest.approx(float(ref_loss), abs=1e-6)
    _close(grads, ref)
    assert metrics["grpo_behaviour_dropped_frac"] == pytest.approx(len(own[6]) / _n_tokens(plan))
    # the row alone: its share of the gradient is exactly zero
    only = replace(
        plan,
        prompt_ids=[plan.prompt_ids[6]],
        completion_ids=[plan.completion_ids[6]],
        group_ids=[0],
        advantages=[1.0],
        global_rows=1,
        behaviour_logprobs=[behaviour[6]],
    )
    loss6, grads6, _ = _one_pass(model, only, _cfg("seq_mask"))
    assert float(loss6) == 0.0
    assert all(float(g.abs().max()) == 0.0 for g in grads6.values())


# ---------------------------------------------------------------- (d) the mismatch metrics


@pytest.mark.parametrize("mode", ["off", "tis", "masked", "seq_mask"])
def test_mismatch_metrics_are_the_hand_values(model: torch.nn.Module, mode: str) -> None:
    plan = _plan()
    own = _own(model, plan)
    shifts = {p: 2.0 for p in PERTURBED} | {p: -math.log(3.0) for p in HIGH}
    cfg = _cfg(mode, seq_threshold=3.0)  # no row's sum (2.0 or ln 3) near the bound
    _, _, metrics = _one_pass(model, replace(plan, behaviour_logprobs=_perturbed(own, shifts)), cfg)
    n = _n_tokens(plan)
    assert metrics["grpo_n_tokens"] == n
    assert metrics["grpo_mismatch_mean"] == pytest.approx((4 * 2.0 + 2 * math.log(3.0)) / n, rel=1e-5)
    assert metrics["grpo_mismatch_max"] == pytest.approx(2.0, rel=1e-5)
    assert metrics["grpo_mismatch_out_frac"] == pytest.approx(6 / n)
    # masked drops the 6 tokens outside [0.5, 2]; seq_mask the rows whose sum passes 3 (none);
    # tis and off none
    dropped = {"off": 0.0, "tis": 0.0, "masked": 6 / n, "seq_mask": 0.0}[mode]
    assert metrics["grpo_behaviour_dropped_frac"] == pytest.approx(dropped)
    assert ("grpo_behaviour_weight_mean" in metrics) == (mode != "off")


# ---------------------------------------------------------------- (e) micro-batches


CUTS = [MicroBatching(sequences=1), MicroBatching(tokens=40)]


@pytest.mark.parametrize("mode", ["off", "tis", "masked", "seq_mask"])
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batches_make_the_one_pass_term(model: torch.nn.Module, mode: str, aggregation: str) -> None:
    plan = _plan()
    own = _own(model, plan)
    noise = torch.Generator().manual_seed(3)
    # each token within +-1.2 nats (ratios on both sides of [0.5, 2]), rows' sums on both sides
    # of 2, and the largest gap (2.6 nats) in a row of the last micro-batch
    behaviour = [(torch.tensor(r) + torch.rand(len(r), generator=noise) * 2.4 - 1.2).tolist() for r in own]
    behaviour[12][0] = own[12][0] - 2.6
    cfg = GrpoConfig.model_validate(
        {"loss_aggregation": aggregation, "behaviour_correction": {"mode": mode, "seq_threshold": 1.0}}
    )
    stale = mode == "off"  # off: the engine's log-probs are also the ratio's old policy
    p = replace(plan, behaviour_logprobs=behaviour, old_logprobs=behaviour if stale else None)
    loss, whole, wm = _one_pass(model, p, cfg)
    assert wm["grpo_mismatch_max"] == pytest.approx(2.6, rel=1e-5)
    if mode != "off":
        assert 0.0 < wm["grpo_behaviour_dropped_frac"] < 1.0 or mode == "tis"
    for cut in CUTS:
        value, parts, pm = _cut(model, p, cfg, cut)
        assert pm["micro_batches"] > 1
        assert value == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
        _close(whole, parts)
        for k in wm:
            assert pm[k] == pytest.approx(wm[k], rel=1e-5, abs=1e-6), k
        assert set(pm) - set(wm) == {"micro_batches", "padding_share"}


def test_the_maximum_over_micro_batches_and_ranks() -> None:
    sums = TermSums(maxima={"mismatch_max"})
    sums.add({"a": 1.0, "mismatch_max": 0.5})
    sums.add({"a": 2.0, "mismatch_max": 2.5})
    sums.add({"a": 0.5, "mismatch_max": 1.0})
    assert sums.over_ranks(None) == {"a": 3.5, "mismatch_max": 2.5}
    # two ranks: the sums add, the maxima take the larger (this rank's 2.5 against the other's 4)
    two = sums.over_ranks(lambda t: t * 2, reduce_max=lambda t: torch.maximum(t, torch.full_like(t, 4.0)))
    assert two == {"a": 7.0, "mismatch_max": 4.0}
    with pytest.raises(ValueError, match="reduce_max"):
        sums.over_ranks(lambda t: t)
    one = World()
    t = torch.tensor([1.0, 3.0])
    assert torch.equal(one.max(t), t) and torch.equal(one.sum(t), t)


# ---------------------------------------------------------------- (f) off is today's update


def test_off_with_the_learners_own_logprobs_is_todays_on_policy_update(model: torch.nn.Module) -> None:
    plan = _plan()
    own = _own(model, plan)
    today_loss, today, today_m = _one_pass(model, plan, GrpoConfig())
    loss, grads, metrics = _one_pass(model, replace(plan, behaviour_logprobs=own), GrpoConfig())
    assert torch.equal(loss, today_loss)
    assert set(grads) == set(today) and all(torch.equal(grads[k], today[k]) for k in grads)
    assert {k: v for k, v in metrics.items() if k in today_m} == today_m
    assert metrics["grpo_mismatch_max"] <= 1e-6 and metrics["grpo_mismatch_out_frac"] == 0.0
    cut = MicroBatching(tokens=40)
    v0, g0, _ = _cut(model, plan, GrpoConfig(), cut)
    v1, g1, _ = _cut(model, replace(plan, behaviour_logprobs=own), GrpoConfig(), cut)
    assert v0 == v1 and all(torch.equal(g0[k], g1[k]) for k in g0)


# ---------------------------------------------------------------- plan_rl


def _batch(version: int) -> RolloutBatch:
    verdicts = [RewardVerdict(1.0, OK), RewardVerdict(0.0, WRONG_ANSWER)] * 2
    return RolloutBatch(
        domain="math",
        problems=[Problem(id=f"math-{i}", domain="math", prompt="q", answer="1") for i in range(2)],
        group_size=2,
        prompt_ids=[[3, 4, 5]] * 4,
        completion_ids=[[6 + i, 7, 8] for i in range(4)],
        logprobs=[[-1.0 - i, -2.0, -0.5] for i in range(4)],
        finish_reasons=["stop"] * 4,
        texts=[""] * 4,
        verdicts=verdicts,
        policy_version=version,
        temperature=1.0,
    )


@pytest.mark.parametrize("mode", ["off", "tis", "masked", "seq_mask"])
@pytest.mark.parametrize("stale", [False, True])
def test_plan_rl_carries_the_engines_logprobs(mode: str, stale: bool) -> None:
    batch = _batch(version=2 if stale else 3)
    plan = plan_rl(batch, _cfg(mode), current_version=3, drop_zero_variance=True)
    assert plan.behaviour_logprobs == batch.logprobs  # always: the correction's and the metrics'
    # the ratio's old policy: the engine's only for a stale batch with the correction off
    assert plan.old_logprobs == (batch.logprobs if stale and mode == "off" else None)
    share = plan.share(1, 2)
    assert share.behaviour_logprobs == batch.logprobs[2:]
    assert share.old_logprobs == (None if plan.old_logprobs is None else batch.logprobs[2:])

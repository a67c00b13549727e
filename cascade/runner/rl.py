"""The RL term of a learner update: which sequences the GRPO loss trains on (`plan_rl`, the
verifier-failure bound, a sharded learner's rank shares) and the loss over them (`rl_loss`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from cascade.algo import (
    BehaviourSettings,
    GrpoLossInput,
    GrpoLossOutput,
    GrpoNorms,
    group_advantages,
    grpo_loss,
    grpo_normalisers,
    zero_variance_mask,
)
from cascade.algo.grpo import MAX_METRICS
from cascade.algo.masking import MaxOverRanks, SumOverRanks
from cascade.algo.turn_mask import TurnLayout, model_token_mask
from cascade.config import GrpoConfig
from cascade.engine.batch import SequenceBatch, build_batch
from cascade.engine.logprobs import DEFAULT_CHUNK_BYTES, completion_logprobs, completion_logprobs_entropy
from cascade.engine.microbatch import MicroBatching, Span, micro_batch_spans, padded_tokens
from cascade.rollout.requests import RolloutBatch
from cascade.runner.optimizer_step import LossTerm, placeholder_batch
from cascade.runner.term_sums import TermSums
from cascade.tools.turn_loop import turn_metrics


def _padded_logprobs(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row[:width])
    return out


class VerifierFailureError(RuntimeError):
    """A step whose share of failed-verifier (`infra_error`) samples passed the configured
    bound (`grpo.max_verifier_failure_fraction`): training on the rest would learn from noise,
    so the stage should stop. `causes` are the most frequent infra-error details, with counts."""

    def __init__(
        self, fraction: float, bound: float, n_failed: int, n_total: int, causes: list[tuple[str, int]]
    ) -> None:
        self.fraction = fraction
        self.bound = bound
        self.n_failed = n_failed
        self.n_total = n_total
        self.causes = causes
        top = "; ".join(f"{n}x {detail or '(no detail)'}" for detail, n in causes) or "none recorded"
        super().__init__(
            f"verifier failed on {n_failed} of {n_total} samples ({fraction:.1%}), above the bound "
            f"max_verifier_failure_fraction={bound:g}; top causes: {top}"
        )


def check_verifier_failures(batch: RolloutBatch, bound: float, *, top: int = 3) -> float:
    """The step's share of failed-verifier samples; raises `VerifierFailureError` above `bound`."""
    failed = [v.detail for v in batch.verdicts if v.is_infra_error]
    total = len(batch.verdicts)
    fraction = len(failed) / total if total else 0.0
    if fraction > bound:
        causes = Counter(detail[:200] for detail in failed).most_common(top)
        raise VerifierFailureError(fraction, bound, len(failed), total, causes)
    return fraction


@dataclass
class RlPlan:
    """The RL term's rows, chosen from the whole batch before any forward pass (advantages and
    the zero-variance filter need every group): each kept sequence with its group, advantage and
    behaviour log-probs. `metrics` describe the whole batch. A sharded learner gives each rank a
    `share` of whole groups."""

    metrics: dict[str, float]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    group_ids: list[int]
    advantages: list[float]
    old_logprobs: list[list[float]] | None
    """The PPO ratio's old policy: the engine's log-probs of a stale batch; None: the batch is
    on-policy (made by the weights being trained), or the behaviour correction is on (the ratio
    is then taken against the learner's own log-probs)."""
    temperature: float
    global_rows: int
    """Rows of the whole plan (a share's own rows may be none while other ranks have some)."""
    layouts: list[TurnLayout] | None = None
    """Multi-turn rows: only the model's tokens are trained (`model_token_mask`)."""
    micro_batches: int = 1
    """The fewest micro-batches this plan's term runs in (a sharded learner sets every rank's
    to the most any rank's share needs: the ranks' forward and backward passes pair up)."""
    behaviour_logprobs: list[list[float]] | None = None
    """The engine's log-probs of the tokens, on-policy or not: the behaviour correction's
    (`grpo.behaviour_correction`) and the mismatch metrics' (reported with the correction off
    too, changing nothing else). None: not known (the metrics are then not reported)."""

    @property
    def empty(self) -> bool:
        return not self.group_ids

    def spans(self, batching: MicroBatching) -> list[Span]:
        """The micro-batches of this plan's rows under `batching`."""
        return micro_batch_spans(
            [len(p) for p in self.prompt_ids],
            [len(c) for c in self.completion_ids],
            batching,
            at_least=self.micro_batches,
        )

    def in_one_pass(self, batching: MicroBatching) -> bool:
        return len(self.spans(batching)) <= 1

    def share(self, rank: int, size: int) -> RlPlan:
        """Rank `rank`'s part of the rows: a contiguous block of whole groups (groups differ in
        size after filtering, so blocks are cut by group, never inside one)."""
        groups = sorted(set(self.group_ids))
        mine = set(groups[len(groups) * rank // size : len(groups) * (rank + 1) // size])
        rows = [i for i, gid in enumerate(self.group_ids) if gid in mine]
        return RlPlan(
            metrics=self.metrics,
            prompt_ids=[self.prompt_ids[i] for i in rows],
            completion_ids=[self.completion_ids[i] for i in rows],
            group_ids=[self.group_ids[i] for i in rows],
            advantages=[self.advantages[i] for i in rows],
            old_logprobs=None if self.old_logprobs is None else [self.old_logprobs[i] for i in rows],
            temperature=self.temperature,
            global_rows=self.global_rows,
            behaviour_logprobs=(
                None if self.behaviour_logprobs is None else [self.behaviour_logprobs[i] for i in rows]
            ),
            layouts=None if self.layouts is None else [self.layouts[i] for i in rows],
            micro_batches=self.micro_batches,
        )


def plan_rl(
    batch: RolloutBatch, cfg: GrpoConfig, *, current_version: int, drop_zero_variance: bool
) -> RlPlan:
    """Which sequences the GRPO term trains on, with their advantages.

    Samples whose verifier failed take no part in their group's statistics and get no
    gradient; a step with more of them than `cfg.max_verifier_failure_fraction` raises
    `VerifierFailureError` before any forward pass.

    The engine's log-probs always go along as `behaviour_logprobs` (the correction's, and the
    mismatch metrics' with it off); as `old_logprobs` only for a stale batch with the
    correction off (with it on, the ratio's old policy is the learner's own).
    """
    g = batch.group_size
    failure_fraction = check_verifier_failures(batch, cfg.max_verifier_failure_fraction)
    rewards = batch.rewards()  # [N, G]
    valid = batch.valid_mask()  # [N*G]
    adv = group_advantages(rewards, valid.view_as(rewards)).flatten()  # [N*G]
    zero_var = zero_variance_mask(rewards, valid.view_as(rewards))  # [N]
    keep = valid.clone()
    if drop_zero_variance:
        keep &= (~zero_var).repeat_interleave(g)
    if cfg.overlong == "mask":
        keep &= ~batch.truncated_mask()
    valid_rewards = rewards.flatten()[valid]
    metrics = {
        "reward_mean": float(valid_rewards.mean()) if valid_rewards.numel() else 0.0,
        "verifier_failure_fraction": failure_fraction,
        "zero_variance_groups": float(zero_var.float().mean()),
        "truncated_fraction": float(batch.truncated_mask().float().mean()),
        "completion_tokens_mean": sum(len(c) for c in batch.completion_ids) / len(batch.completion_ids),
        "kept_sequences": float(keep.sum()),
        **(
            {"model_tokens_mean": sum(lay.n_model for lay in batch.layouts) / len(batch.layouts)}
            if batch.layouts
            else {}
        ),
        **turn_metrics(batch.episodes),
        "staleness": float(current_version - batch.policy_version),
    }
    idx = torch.nonzero(keep).flatten().tolist()
    engine = [batch.logprobs[i] for i in idx]
    stale = batch.policy_version != current_version
    return RlPlan(
        metrics=metrics,
        prompt_ids=[batch.prompt_ids[i] for i in idx],
        completion_ids=[batch.completion_ids[i] for i in idx],
        group_ids=[i // g for i in idx],
        advantages=adv[idx].tolist(),
        old_logprobs=engine if stale and cfg.behaviour_correction.mode == "off" else None,
        temperature=batch.temperature,
        global_rows=len(idx),
        behaviour_logprobs=engine,
        layouts=[batch.layouts[i] for i in idx] if batch.layouts else None,
    )


def rl_loss(
    model: PreTrainedModel,
    plan: RlPlan,
    cfg: GrpoConfig,
    *,
    pad_id: int,
    ref_model: PreTrainedModel | None = None,
    reduce: SumOverRanks | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    reduce_max: MaxOverRanks | None = None,
) -> LossTerm:
    """GRPO loss over `plan`'s rows; None when the plan is empty (nothing to learn from).

    With `reduce` (and `reduce_max`, for the metrics that are maxima) the plan is one rank's
    share: every rank must call this, empty share or not."""
    metrics = dict(plan.metrics)
    if plan.global_rows == 0:
        return LossTerm(None, metrics)
    device = model.device  # every tensor of the loss lives where the model does
    if plan.empty:
        sb = placeholder_batch(pad_id).to(device)
        advantages, group_ids = torch.zeros(1), torch.zeros(1, dtype=torch.long)
    else:
        sb = build_batch(plan.prompt_ids, plan.completion_ids, pad_id)
        if plan.layouts is not None:  # the environment's tokens are context, never trained
            sb.completion_mask = model_token_mask(plan.layouts, sb.completion_mask).float()
        sb = sb.to(device)
        advantages, group_ids = torch.tensor(plan.advantages), torch.tensor(plan.group_ids)
    old_rows = None if plan.old_logprobs is None else (plan.old_logprobs if not plan.empty else [[0.0]])
    behaviour_rows = None
    if plan.behaviour_logprobs is not None:
        behaviour_rows = plan.behaviour_logprobs if not plan.empty else [[0.0]]
    out, entropy = _grpo_forward(
        model,
        sb,
        advantages,
        group_ids,
        old_rows,
        plan.temperature,
        cfg,
        ref_model,
        chunk_bytes,
        reduce=reduce,
        reduce_max=reduce_max,
        behaviour_rows=behaviour_rows,
    )
    metrics.update({f"grpo_{k}": v for k, v in out.metrics.items()})
    total = reduce or (lambda t: t)
    metrics["grpo_entropy"] = float(total(entropy.sum())) / max(out.metrics["n_tokens"], 1.0)
    return LossTerm(out.loss, metrics)


def _grpo_forward(
    model: PreTrainedModel,
    sb: SequenceBatch,
    advantages: torch.Tensor,
    group_ids: torch.Tensor,
    old_rows: list[list[float]] | None,
    temperature: float,
    cfg: GrpoConfig,
    ref_model: PreTrainedModel | None,
    chunk_bytes: int,
    *,
    reduce: SumOverRanks | None = None,
    reduce_max: MaxOverRanks | None = None,
    norms: GrpoNorms | None = None,
    behaviour_rows: list[list[float]] | None = None,
) -> tuple[GrpoLossOutput, torch.Tensor]:
    """The GRPO loss of the rows of `sb` (on the model's device) and their entropy [B, C]: the
    policy's forward, the engine's log-probs laid out on its width (as the ratio's old policy,
    and as the behaviour correction's), the reference's forward."""
    device = model.device
    logp, entropy = completion_logprobs_entropy(model, sb, temperature, chunk_bytes=chunk_bytes)
    width = sb.completion_ids.shape[1]
    old = None if old_rows is None else _padded_logprobs(old_rows, width).to(device)
    behaviour = None if behaviour_rows is None else _padded_logprobs(behaviour_rows, width).to(device)
    bc = cfg.behaviour_correction
    ref = None
    if cfg.kl_coef > 0 and ref_model is not None:
        with torch.no_grad():
            ref = completion_logprobs(ref_model, sb, temperature, chunk_bytes=chunk_bytes)
    out = grpo_loss(
        GrpoLossInput(
            logprobs=logp,
            advantages=advantages.to(device),
            mask=sb.completion_mask,
            group_ids=group_ids.to(device),
            old_logprobs=old,
            ref_logprobs=ref,
            aggregation=cfg.loss_aggregation,
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            kl_coef=cfg.kl_coef,
            reduce=reduce,
            norms=norms,
            behaviour_logprobs=behaviour,
            behaviour=BehaviourSettings(bc.mode, bc.low, bc.high, bc.seq_threshold),
            reduce_max=reduce_max,
        )
    )
    return out, entropy


def _rl_micro_batch(
    plan: RlPlan, span: Span, pad_id: int
) -> tuple[SequenceBatch, torch.Tensor, torch.Tensor]:
    """Rows `span` of the plan as a batch, with their advantages and group ids (a placeholder row
    with nothing counted for an empty span)."""
    lo, hi = span
    if lo == hi:
        return placeholder_batch(pad_id), torch.zeros(1), torch.zeros(1, dtype=torch.long)
    sb = build_batch(plan.prompt_ids[lo:hi], plan.completion_ids[lo:hi], pad_id)
    if plan.layouts is not None:  # the environment's tokens are context, never trained
        sb.completion_mask = model_token_mask(plan.layouts[lo:hi], sb.completion_mask).float()
    return sb, torch.tensor(plan.advantages[lo:hi]), torch.tensor(plan.group_ids[lo:hi])


def rl_backward(
    model: PreTrainedModel,
    plan: RlPlan,
    cfg: GrpoConfig,
    *,
    pad_id: int,
    batching: MicroBatching,
    autocast: Callable[[], AbstractContextManager[object]],
    ref_model: PreTrainedModel | None = None,
    reduce: SumOverRanks | None = None,
    reduce_max: MaxOverRanks | None = None,
) -> tuple[float | None, dict[str, float]]:
    """The GRPO term in micro-batches (`plan.spans`): each one's forward (under `autocast`),
    then its backward, its part of the step's loss accumulating in the parameters' gradients.
    The normalisers are the step's, from every row's counted tokens before the first forward
    (`grpo_normalisers`: a group's statistics span it wherever its rows land), so the gradient
    is the one-pass gradient to float rounding, whatever the cut. Returns the term's value (None:
    no row on any rank) and its metrics, each summed over micro-batches and then, in one call,
    over ranks (the maxima, `MAX_METRICS`, maximised in one more call of `reduce_max`)."""
    metrics = dict(plan.metrics)
    if plan.global_rows == 0:
        return None, metrics
    device = model.device
    spans = plan.spans(batching)
    batches = [_rl_micro_batch(plan, span, pad_id) for span in spans]
    real, padded = padded_tokens(
        [len(p) for p in plan.prompt_ids], [len(c) for c in plan.completion_ids], spans
    )
    counted = [
        sb.completion_mask.sum(dim=1) for (lo, hi), (sb, _, _) in zip(spans, batches, strict=True) if hi > lo
    ]
    row_tokens = torch.cat(counted) if counted else torch.zeros(0)
    all_groups = torch.tensor(plan.group_ids, dtype=torch.long)
    norms = grpo_normalisers(row_tokens, all_groups, cfg.loss_aggregation, reduce)
    sums = TermSums(maxima=MAX_METRICS)
    sums.add({"real_tokens": float(real), "padded_tokens": float(padded)})
    for (lo, hi), (sb, advantages, group_ids) in zip(spans, batches, strict=True):
        sb = sb.to(device)
        # a placeholder row counts nothing and is scaled by nothing
        rows = norms.rows(lo, hi) if hi > lo else GrpoNorms(torch.zeros(1), norms.n_units, norms.n_tokens)
        old_rows = None
        if plan.old_logprobs is not None:
            old_rows = plan.old_logprobs[lo:hi] if hi > lo else [[0.0]]
        behaviour_rows = None
        if plan.behaviour_logprobs is not None:
            behaviour_rows = plan.behaviour_logprobs[lo:hi] if hi > lo else [[0.0]]
        with autocast():
            out, entropy = _grpo_forward(
                model,
                sb,
                advantages,
                group_ids,
                old_rows,
                plan.temperature,
                cfg,
                ref_model,
                batching.logits_chunk_bytes,
                norms=rows.to(device),
                behaviour_rows=behaviour_rows,
            )
        out.loss.backward()
        sums.add({"loss": float(out.loss.detach()), **out.metrics})
        sums.add({"entropy": float(entropy.sum()) / float(norms.n_tokens.clamp(min=1))})
    total = sums.over_ranks(reduce, reduce_max=reduce_max)
    loss = total.pop("loss")
    real_all, padded_all = total.pop("real_tokens"), total.pop("padded_tokens")
    metrics.update({f"grpo_{k}": v for k, v in total.items()})
    metrics["micro_batches"] = float(len(spans))
    metrics["padding_share"] = 1.0 - real_all / padded_all if padded_all else 0.0
    return loss, metrics


def rl_term(
    model: PreTrainedModel,
    batch: RolloutBatch,
    cfg: GrpoConfig,
    *,
    pad_id: int,
    current_version: int,
    drop_zero_variance: bool,
    ref_model: PreTrainedModel | None = None,
) -> LossTerm:
    """GRPO loss over the groups of `batch` that carry signal (`plan_rl`, then `rl_loss`)."""
    plan = plan_rl(batch, cfg, current_version=current_version, drop_zero_variance=drop_zero_variance)
    return rl_loss(model, plan, cfg, pad_id=pad_id, ref_model=ref_model)

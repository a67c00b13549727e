"""The regression gate's cheap early warning (`gate.drift_every`): how far the policy has moved
from the stage-start policy on a fixed set of earlier domains' prompts, as a KL, every few steps:
a drift shows before the expensive eval finds a drop.

The probe is made once per stage from the stage-start weights: the first `drift_prompts` eval
prompts of each guarded domain with the stage-start policy's greedy completions. Each reading is
the exact `KL(policy || stage start)` of the next-token distributions over the whole vocabulary,
averaged over those completions' tokens."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from cascade.config import ChatConfig
from cascade.domains.base import Problem
from cascade.engine.batch import SequenceBatch, build_batch
from cascade.engine.logprobs import completion_logits
from cascade.model.loading import Policy
from cascade.rollout.policy import sample_completions
from cascade.runner.frozen_models import FrozenModelCache


def drift_probe(
    start: Policy, chat: ChatConfig, problems: list[Problem], *, max_new_tokens: int, thinking: bool
) -> SequenceBatch:
    """The prompts of `problems` with the stage-start policy's greedy completions."""
    with torch.no_grad():
        prompt_ids, gen = sample_completions(
            start,
            chat,
            problems,
            n=1,
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            thinking=thinking,
            generator=None,
            greedy=True,
        )
    return build_batch(prompt_ids, gen.completion_ids, start.pad_token_id)


def drift_kl(policy: PreTrainedModel, start: PreTrainedModel, probe: SequenceBatch) -> float:
    """Mean per-token `KL(policy || start)` over the probe's completion tokens (0 when none)."""
    with torch.no_grad():
        sb = probe.to(policy.device)
        lp = F.log_softmax(completion_logits(policy, sb), dim=-1)
        lp_start = F.log_softmax(completion_logits(start, sb.to(start.device)).to(lp.device), dim=-1)
        kl = (lp.exp() * (lp - lp_start)).sum(dim=-1)  # [B, C]
        mask = sb.completion_mask != 0
        n = int(mask.sum())
        return float(torch.where(mask, kl, torch.zeros_like(kl)).sum()) / n if n else 0.0


class DriftWarning:
    """The readings of one run: the stage-start policy loaded once per checkpoint, the probe made
    once per stage (from that policy), each reading against the policy being trained."""

    def __init__(self, dtype: str, device: torch.device | str) -> None:
        self._frozen = FrozenModelCache(dtype, device)
        self._probes: dict[str, SequenceBatch] = {}
        self._probes_of = -1

    def readings(
        self,
        stage_index: int,
        policy: Policy,
        start_path: Path,
        chat: ChatConfig,
        problems: dict[str, list[Problem]],
        *,
        max_new_tokens: int,
        thinking: bool,
    ) -> dict[str, float]:
        """`drift_kl/<domain>` for each domain of `problems` (its probe's prompts)."""
        start = self._frozen.get("stage-start", start_path)
        if self._probes_of != stage_index:
            start_policy = Policy(start, policy.tokenizer)
            self._probes = {
                d: drift_probe(start_policy, chat, probs, max_new_tokens=max_new_tokens, thinking=thinking)
                for d, probs in problems.items()
            }
            self._probes_of = stage_index
        return {f"drift_kl/{d}": drift_kl(policy.model, start, probe) for d, probe in self._probes.items()}

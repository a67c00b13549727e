"""Dynamic filtering: spend rollouts only where they can teach something.

Two levels (docs/algorithm.md, "Dynamic filtering"):
- batch: a group whose rewards are all equal has zero advantages and no gradient; drop it.
- epoch: a prompt the policy always (or never) solves wastes a whole group each time it is
  drawn. `PromptPassRateFilter` tracks each prompt's running mean reward and stops sampling
  prompts at either extreme once `min_attempts` rewards are in, except that a filtered prompt
  is readmitted with probability `readmit_prob` each time it is considered (pass rates drift as
  the policy learns or forgets).

The filter's state is a plain JSON-able dict so it is saved with the learner checkpoint; all
randomness comes from the caller's `random.Random`, so a seeded run draws the same prompts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from cascade.algo.advantages import zero_variance_mask
from cascade.config import FilterConfig


def filter_zero_variance(rewards: Tensor) -> Tensor:
    """Keep mask: True for groups whose rewards are not all equal. rewards: [n_groups, G]."""
    return ~zero_variance_mask(rewards)


class PromptPassRateFilter:
    """Per-prompt running mean reward (the pass rate for 0/1 rewards) and the sampling rule.

    With `config.prompt_filter` off, every prompt is always active (the statistics are still
    kept, so turning it on later starts informed).
    """

    def __init__(self, config: FilterConfig) -> None:
        self.config = config
        self._stats: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------------ statistics

    def update(self, prompt_id: str, rewards: Sequence[float]) -> None:
        """Add the rewards of one group (or any number of samples) for `prompt_id`."""
        if not rewards:
            return
        entry = self._stats.setdefault(prompt_id, {"attempts": 0, "reward_sum": 0.0})
        entry["attempts"] += len(rewards)
        entry["reward_sum"] += float(sum(rewards))

    def attempts(self, prompt_id: str) -> int:
        entry = self._stats.get(prompt_id)
        return int(entry["attempts"]) if entry else 0

    def pass_rate(self, prompt_id: str) -> float | None:
        """Mean reward over every sample seen for the prompt; None if never seen."""
        entry = self._stats.get(prompt_id)
        if not entry or entry["attempts"] == 0:
            return None
        return entry["reward_sum"] / entry["attempts"]

    def is_filtered(self, prompt_id: str) -> bool:
        """Deterministic part of the rule: enough attempts and a pass rate at either extreme."""
        if not self.config.prompt_filter or self.attempts(prompt_id) < self.config.min_attempts:
            return False
        rate = self.pass_rate(prompt_id)
        assert rate is not None
        return rate >= self.config.solved_threshold or rate <= self.config.unsolved_threshold

    # ------------------------------------------------------------------ sampling

    def is_active(self, prompt_id: str, rng: random.Random) -> bool:
        """True unless filtered; a filtered prompt is readmitted when `rng.random() < readmit_prob`.

        `rng` is consumed (one draw) only for filtered prompts.
        """
        if not self.is_filtered(prompt_id):
            return True
        return rng.random() < self.config.readmit_prob

    def sample(self, prompt_ids: Sequence[str], k: int, rng: random.Random) -> list[str]:
        """`k` distinct prompts, drawn uniformly from the active ones in the order given.

        If fewer than `k` are active, all active prompts are taken and the rest are drawn from
        the filtered ones. Deterministic for a given `rng` state and filter state; raises
        ValueError if `k` exceeds the number of prompts.
        """
        if k < 0 or k > len(prompt_ids):
            raise ValueError(f"cannot sample {k} prompts from {len(prompt_ids)}")
        active: list[str] = []
        inactive: list[str] = []
        for pid in prompt_ids:
            (active if self.is_active(pid, rng) else inactive).append(pid)
        if len(active) >= k:
            return rng.sample(active, k)
        chosen = rng.sample(active, len(active)) + rng.sample(inactive, k - len(active))
        return chosen

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: `{"prompts": {prompt_id: {"attempts": int, "reward_sum": float}}}`."""
        return {
            "prompts": {
                pid: {"attempts": int(e["attempts"]), "reward_sum": float(e["reward_sum"])}
                for pid, e in self._stats.items()
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        prompts = state["prompts"]
        self._stats = {
            str(pid): {"attempts": int(e["attempts"]), "reward_sum": float(e["reward_sum"])}
            for pid, e in prompts.items()
        }

"""The sandboxed domains' eval verdicts from the reward service.

The learner scores its evals itself. For code and swe that means running programs the model
wrote, which only the reward service's workers may do: they hold the bubblewrap sandbox (and the
relaxed seccomp, AppArmor and /proc settings it needs). With `--reward`, a distributed learner
hands those domains' eval completions to the reward service, as the rollout workers hand it the
training completions, and its own container needs no sandbox. Same verifier, same config, so the
verdicts are those the learner would have computed.

Still local: math, if, rlhf (no program runs), and the agent domain, whose eval plays the turn
loop in the learner (its python tool, when configured, needs the sandbox there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cascade.config import CascadeConfig
from cascade.domains import make_domain
from cascade.domains.base import Domain, Problem, RewardVerdict
from cascade.resilience import Dependency
from cascade.transport.channel import ServiceUnavailable, open_channel, outage_aware
from cascade.transport.reward_client import RewardClient

SANDBOXED = frozenset({"code", "swe"})
"""Domains whose verifier runs the completion's code."""


class ServiceScored:
    """A domain whose problems are built here and whose verdicts come from the reward service.
    No `prepare()`: the run does not look for a sandbox on the learner's host."""

    def __init__(
        self, local: Domain, client: RewardClient, reward_config: dict[str, Any] | None, outage: Dependency
    ) -> None:
        self.name = local.name
        self._local, self._client, self._reward_config, self._outage = local, client, reward_config, outage

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return self._local.make_problems(split, n, seed)

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        def call() -> list[RewardVerdict]:
            return self._client.score(self.name, problems, completions, reward_config=self._reward_config)

        return self._outage.call(lambda: outage_aware("reward service", call))


class EvalScorers:
    """The learner's eval verifiers: `ServiceScored` for the sandboxed domains, local for the rest;
    owns the reward service's channel."""

    def __init__(self, config: CascadeConfig, address: str, outage: Dependency) -> None:
        self._channel = open_channel(address)
        client = RewardClient(self._channel)
        self.domains: dict[str, Domain] = {}
        for d in config.domains:
            local = make_domain(d)
            if d.kind in SANDBOXED:
                settings = d.reward_settings
                cfg = settings.model_dump(mode="json") if settings is not None else None
                self.domains[d.name] = ServiceScored(local, client, cfg, outage)
            else:
                self.domains[d.name] = local

    def close(self) -> None:
        self._channel.close()


def reward_outage(bound_s: float, log: Callable[[str], None]) -> Dependency:
    return Dependency("reward", give_up_after_s=bound_s, transient=(ServiceUnavailable,), log=log)

"""The distributed learner: the stage loop (`cascade.runner.CascadeRunner`) with the services as
its sources. Nothing here decides what is learned; it only wires addresses to sources."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.config import CascadeConfig, ResilienceConfig
from cascade.resilience import Dependency
from cascade.runner.loop import CascadeRunner
from cascade.runner.sources import RunSources, TeacherSource
from cascade.transport.channel import ServiceUnavailable
from cascade.transport.redis_streams import TRANSIENT as REDIS_TRANSIENT
from cascade.transport.rollout_replicas import Addresses
from services.learner.eval_scoring import EvalScorers, reward_outage
from services.learner.replicas import NoReplicaLeft, RolloutReplicas
from services.learner.sources import NoTeachers, ServiceTeachers, StreamRollouts


@dataclass(frozen=True)
class ServiceOutages:
    """The services the learner rides out blips of, each bounded by its `resilience.*_s`."""

    redis: Dependency
    teacher: Dependency
    rollout: Dependency
    reward: Dependency

    @classmethod
    def from_config(cls, cfg: ResilienceConfig, log: Callable[[str], None]) -> ServiceOutages:
        return cls(
            redis=Dependency("redis", give_up_after_s=cfg.redis_s, transient=REDIS_TRANSIENT, log=log),
            teacher=Dependency(
                "teacher", give_up_after_s=cfg.teacher_s, transient=(ServiceUnavailable,), log=log
            ),
            rollout=Dependency("rollout", give_up_after_s=cfg.rollout_s, transient=(NoReplicaLeft,), log=log),
            reward=reward_outage(cfg.reward_s, log),
        )

    def all(self) -> list[Dependency]:
        return [self.redis, self.teacher, self.rollout, self.reward]


def distributed_runner(
    config: CascadeConfig,
    *,
    run_dir: Path,
    redis_url: str,
    stream_prefix: str,
    rollout: str | None,
    teacher: str | None,
    rollout_dns: str | None = None,
    rollout_wait_s: float = 60.0,
    reward: str | None = None,
    on_replica_failure: Callable[[str, str], None] | None = None,
    keep_weights: int = 2,
    outages: ServiceOutages | None = None,
    **kwargs: Any,
) -> CascadeRunner:
    """The loop over the services; `kwargs` as `CascadeRunner`'s (db_url, resume, follow, ...).

    `rollout`: one or more rollout replicas `host:port[,host:port...]`; `rollout_dns`: a name
    (`name:port`, a headless Service) resolved to all its addresses at each weight push.
    `reward`: the reward service `host:port` that scores the sandboxed domains' evals
    (`eval_scoring`); without it the learner runs their verifiers itself and needs the sandbox.
    `outages`: the Redis, teacher and rollout dependencies (default: from `config.resilience`)."""
    distill = kwargs.get("distill", True)
    distils = any(config.teachers_for(i) for i in range(len(config.stages)))
    if distill and teacher is None and distils:
        raise ValueError("this cascade distils: the learner needs --teacher")
    log = kwargs.get("log", print)
    outages = outages or ServiceOutages.from_config(config.resilience, log)
    replicas = RolloutReplicas(
        Addresses.parse(rollout, rollout_dns),
        log=log,
        on_failure=on_replica_failure,
        wait_s=rollout_wait_s,
        outage=outages.rollout,
    )
    rollouts = StreamRollouts(
        redis_url=redis_url,
        stream_prefix=stream_prefix,
        rollout=replicas,
        weights_root=run_dir / "weights",
        keep_weights=keep_weights,
        log=log,
        redis_outage=outages.redis,
    )
    teachers: TeacherSource = NoTeachers()
    if teacher is not None:
        teachers = ServiceTeachers(teacher, vocab_size=_vocab_size(config), log=log, outage=outages.teacher)
    sources = RunSources(rollouts=rollouts, teachers=teachers, weights=rollouts)
    if reward is not None:
        scorers = EvalScorers(config, reward, outages.reward)
        sources.also_close.append(scorers.close)
        kwargs["domains"] = scorers.domains
    try:
        runner = CascadeRunner(config, sources, run_dir=run_dir, **kwargs)
    except BaseException:
        sources.close()
        raise
    runner.store.watched.extend(outages.all())  # their outages become events the API shows
    return runner


def _vocab_size(config: CascadeConfig) -> int:
    return int(json.loads((config.model.path / "config.json").read_text())["vocab_size"])

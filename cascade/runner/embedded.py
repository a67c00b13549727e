"""The whole cascade in one process: the stage loop with in-process sources.

This is the path `make demo` takes. It is `cascade.runner.CascadeRunner`, the loop the
distributed learner runs too, given the policy in this process as the rollout source, frozen
teacher checkpoints as the teacher source, and nowhere to push weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cascade.accel import resolve_learner
from cascade.config import CascadeConfig
from cascade.domains import make_domain
from cascade.domains.base import Domain
from cascade.engine.microbatch import MicroBatching
from cascade.runner.local import InPlaceWeights, LocalRollouts, LocalTeachers
from cascade.runner.loop import CascadeRunner
from cascade.runner.run_state import RunDirError, RunResult
from cascade.runner.sources import RunSources

__all__ = ["RunDirError", "RunResult", "embedded_runner", "embedded_sources"]


def embedded_sources(config: CascadeConfig) -> tuple[RunSources, dict[str, Domain]]:
    domains: dict[str, Domain] = {d.name: make_domain(d) for d in config.domains}
    accel = resolve_learner(config.learner, config.model.dtype)  # teachers live with the policy
    sources = RunSources(
        rollouts=LocalRollouts(domains),
        teachers=LocalTeachers(accel.frozen_dtype, accel.device, MicroBatching.of(config.learner)),
        weights=InPlaceWeights(),
    )
    return sources, domains


def embedded_runner(config: CascadeConfig, *, run_dir: Path, **kwargs: Any) -> CascadeRunner:
    """The loop over in-process sources; `kwargs` as `CascadeRunner`'s."""
    sources, domains = embedded_sources(config)
    return CascadeRunner(config, sources, run_dir=run_dir, domains=domains, **kwargs)

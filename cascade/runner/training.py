"""Who trains the policy for the loop: `LocalTrainer` (the whole model in this process) or
`cascade.runner.sharded.ShardedTrainer` (FSDP2 over the ranks `torchrun` started; this
process is rank 0). Either way `policy` holds the full current weights on the driver, the
weights that generate in an embedded run, are pushed to the rollout service, and are saved as
teachers and references.

The weights the optimizer updates are float32 whatever `model.dtype` (`dtype` here): the
master weights (`cascade.model.loading.MASTER_DTYPE`). `dtype` is the checkpoint's, the one
every model directory the run writes holds (`Policy.save_dtype`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from cascade.accel import Accel
from cascade.config import StageConfig
from cascade.model.loading import Policy, load_trainable_policy
from cascade.parallel.checkpoint import is_sharded, load_master_weights, load_optimizer
from cascade.parallel.world import World
from cascade.runner.checkpoint import load_checkpoint_state, save_checkpoint
from cascade.runner.distill import DistillData
from cascade.runner.frozen_models import FrozenModelCache
from cascade.runner.sharded import ShardedTrainer
from cascade.runner.update import UpdateRequest, run_update


class PolicyTrainer(Protocol):
    policy: Policy
    """The full current weights (set by `load`)."""

    def load(self, path: Path) -> None:
        """The policy's weights from a model directory or a checkpoint."""

    def start_stage(self, stage: StageConfig) -> None:
        """A fresh optimizer with the stage's learning rate and weight decay."""

    def end_stage(self) -> None:
        """The stage's optimizer is dropped (a checkpoint between stages holds none)."""

    def restore(self, checkpoint: Path, *, optimizer: bool, generator: torch.Generator) -> None:
        """Optimizer state (when `optimizer`, i.e. resuming mid-stage) and RNG state."""

    def update(
        self, req: UpdateRequest, distill: Callable[[], list[DistillData]]
    ) -> tuple[dict[str, float], float]:
        """One update; `policy` holds the new weights after it. Returns (metrics, forward s)."""

    def save(self, path: Path, *, generator: torch.Generator, runner_state: dict[str, Any]) -> None:
        """A resumable checkpoint at `path` (also a loadable model directory)."""

    def close(self) -> None: ...


class LocalTrainer:
    """The whole model and optimizer in this process; the policy that trains is `policy`."""

    def __init__(self, accel: Accel, dtype: str) -> None:
        self.accel = accel
        self.dtype = dtype
        self.frozen = FrozenModelCache(accel.frozen_dtype, accel.device)
        self.optimizer: torch.optim.Optimizer | None = None

    def load(self, path: Path) -> None:
        # read on the CPU, a checkpoint's exact float32 weights put in, then moved to the device
        self.policy = load_trainable_policy(path, self.dtype, device="cpu")
        load_master_weights(self.policy.model, path)
        self.policy.model.to(self.accel.device)  # type: ignore[arg-type]

    def start_stage(self, stage: StageConfig) -> None:
        self.optimizer = torch.optim.AdamW(
            self.policy.model.parameters(), lr=stage.grpo.learning_rate, weight_decay=stage.grpo.weight_decay
        )

    def end_stage(self) -> None:
        self.optimizer = None

    def restore(self, checkpoint: Path, *, optimizer: bool, generator: torch.Generator) -> None:
        if optimizer and is_sharded(checkpoint):  # written by a sharded learner: any world size reads it
            assert self.optimizer is not None
            load_optimizer(self.policy.model, self.optimizer, checkpoint)
            optimizer = False
        load_checkpoint_state(
            checkpoint, optimizer=self.optimizer if optimizer else None, generator=generator
        )

    def update(
        self, req: UpdateRequest, distill: Callable[[], list[DistillData]]
    ) -> tuple[dict[str, float], float]:
        assert self.optimizer is not None, "start_stage() first"
        return run_update(
            self.policy.model, self.optimizer, req, distill, accel=self.accel, frozen=self.frozen
        )

    def save(self, path: Path, *, generator: torch.Generator, runner_state: dict[str, Any]) -> None:
        # between stages there is no optimizer: a placeholder keeps the checkpoint's layout
        opt = self.optimizer or torch.optim.AdamW(self.policy.model.parameters(), lr=1e-4)
        save_checkpoint(
            path, policy=self.policy, optimizer=opt, generator=generator, runner_state=runner_state
        )

    def close(self) -> None:
        pass


def make_trainer(world: World, accel: Accel, dtype: str) -> PolicyTrainer:
    """The whole model here for a world of one; FSDP2 over the ranks otherwise (rank 0)."""
    if not world.sharded:
        return LocalTrainer(accel, dtype)
    return ShardedTrainer(world, accel, dtype)

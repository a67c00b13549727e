"""The learner over several ranks: rank 0 runs the stage loop with a `ShardedTrainer`, every
other rank runs `follow`, and each rank holds a `RankShard` (its FSDP2 shard of the policy and
of the optimizer). `as_ranks` is the learner's entry under any launcher: it tells the ranks
apart (`cascade.parallel.launch` starts and joins them) and sends each to its part.

The loop's calls become commands that rank 0 scatters to the others (load, start a stage,
restore, update, save, stop); every rank then does its part of the collective work. An update
gives each rank a contiguous share of the step's groups (and of each teacher's sequences), the
loss is normalised over all ranks, and the gradient reduction sums the shares, so N ranks make
the update one process would on the whole batch. After each update the full weights are
gathered to rank 0's `policy`, the copy that generates, is pushed, and is saved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from cascade.accel import Accel, resolve_learner
from cascade.config import LearnerConfig, StageConfig
from cascade.model.loading import Policy, load_policy, load_trainable_policy
from cascade.parallel.checkpoint import load_master_weights, load_optimizer, save_shards
from cascade.parallel.fsdp import shard_policy
from cascade.parallel.launch import start_rank
from cascade.parallel.world import World, launched_world, leave_world
from cascade.runner.checkpoint import load_checkpoint_state, save_checkpoint
from cascade.runner.distill import DistillData
from cascade.runner.frozen_models import FrozenModelCache
from cascade.runner.update import UpdateRequest, run_update, share_all, share_request


@dataclass
class Command:
    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


_released = False
"""Whether rank 0 has told the other ranks to stop (at most once per process)."""


def release_followers(world: World) -> None:
    """Tell the other ranks to stop, once."""
    global _released
    if _released or not world.driver:
        return
    _released = True
    _scatter(world, [Command("stop")] * world.size)


def _scatter(world: World, items: list[Any] | None) -> Any:
    """Rank 0 gives `items[r]` to rank r; every rank returns its own (collective)."""
    out: list[Any] = [None]
    dist.scatter_object_list(out, items if world.driver else None, src=0)
    return out[0]


class RankShard:
    """One rank's part of the sharded policy and optimizer."""

    def __init__(self, world: World, accel: Accel, dtype: str) -> None:
        self.world = world
        self.accel = accel
        self.dtype = dtype
        self.frozen = FrozenModelCache(accel.frozen_dtype, accel.device)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def load(self, path: Path) -> None:
        # read into host memory, then sharded: `fully_shard` moves each rank's shard to the
        # mesh's device, so no GPU ever holds the whole model for this copy. The shards are
        # float32 master weights whatever `dtype` (a checkpoint's exact ones when it rounds
        # them); FSDP2 gathers them in bfloat16 for compute under mixed precision.
        policy = load_trainable_policy(path, self.dtype, device="cpu")
        load_master_weights(policy.model, path)
        shard_policy(policy.model, self.world, self.accel)
        self.model = policy.model
        self.optimizer = None

    def start_stage(self, lr: float, weight_decay: float) -> None:
        assert self.model is not None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def end_stage(self) -> None:
        self.optimizer = None

    def restore(self, checkpoint: Path) -> None:
        assert self.model is not None and self.optimizer is not None
        load_optimizer(self.model, self.optimizer, checkpoint)

    def update(
        self, req: UpdateRequest, distill: Callable[[], list[DistillData]]
    ) -> tuple[dict[str, float], float]:
        assert self.model is not None and self.optimizer is not None, "start_stage() first"
        return run_update(
            self.model,  # type: ignore[arg-type]
            self.optimizer,
            req,
            distill,
            accel=self.accel,
            frozen=self.frozen,
            reduce=self.world.sum,
            reduce_max=self.world.max,
        )

    def full_weights(self) -> dict[str, Any]:
        """The whole model's weights on rank 0's CPU (empty elsewhere); collective."""
        assert self.model is not None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def save(self, checkpoint: Path) -> None:
        assert self.model is not None
        save_shards(self.model, self.optimizer, checkpoint)


def follow(world: World, accel: Accel, dtype: str) -> None:
    """A rank other than 0: do rank 0's commands until it says stop (or goes away: the
    launcher then ends this process with it)."""
    shard = RankShard(world, accel, dtype)
    while True:
        cmd: Command = _scatter(world, None)
        if cmd.name == "stop":
            return
        if cmd.name == "update":
            shard.update(cmd.args[0], lambda: _scatter(world, None))
            shard.full_weights()
        else:
            getattr(shard, cmd.name)(*cmd.args, **cmd.kwargs)


class ShardedTrainer:
    """Rank 0's trainer (`cascade.runner.training.PolicyTrainer`) over a sharded policy."""

    def __init__(self, world: World, accel: Accel, dtype: str) -> None:
        self.world = world
        self.accel = accel
        self.dtype = dtype
        self.shard = RankShard(world, accel, dtype)

    def _all(self, name: str, *args: Any, **kwargs: Any) -> None:
        """The same command on every rank, this one included."""
        cmd = _scatter(self.world, [Command(name, args, kwargs)] * self.world.size)
        getattr(self.shard, cmd.name)(*cmd.args, **cmd.kwargs)

    def load(self, path: Path) -> None:
        self._all("load", path)
        # not trained: the full weights for generating, pushing and saving, in the checkpoint's
        # dtype (each update gathers the float32 shards into it, rounded; a checkpoint's
        # `dcp/` shards keep the master weights, `RankShard.save`)
        self.policy: Policy = load_policy(path, self.dtype, device=str(self.accel.device))

    def start_stage(self, stage: StageConfig) -> None:
        self._all("start_stage", stage.grpo.learning_rate, stage.grpo.weight_decay)

    def end_stage(self) -> None:
        self._all("end_stage")

    def restore(self, checkpoint: Path, *, optimizer: bool, generator: torch.Generator) -> None:
        if optimizer:
            self._all("restore", checkpoint)
        load_checkpoint_state(checkpoint, optimizer=None, generator=generator)

    def update(
        self, req: UpdateRequest, distill: Callable[[], list[DistillData]]
    ) -> tuple[dict[str, float], float]:
        size = self.world.size
        own = _scatter(self.world, [Command("update", (share,)) for share in share_request(req, size)])

        def distill_shares() -> list[DistillData]:
            fetched = distill()
            shares = [share_all(fetched, r, size, req.pad_id, req.batching) for r in range(size)]
            return _scatter(self.world, shares)

        out = self.shard.update(own.args[0], distill_shares)
        self.policy.model.load_state_dict(self.shard.full_weights())
        return out

    def save(self, path: Path, *, generator: torch.Generator, runner_state: dict[str, Any]) -> None:
        save_checkpoint(
            path,
            policy=self.policy,
            optimizer=None,
            generator=generator,
            runner_state=runner_state,
            write_shards=lambda directory: self._all("save", directory),
        )

    def close(self) -> None:
        release_followers(self.world)


def as_ranks(learner: LearnerConfig, dtype: str, drive: Callable[[World], int]) -> int:
    """The learner's entry under any launcher: `drive(world)` runs on rank 0 (or the only rank),
    the other ranks of a torchrun launch follow it, and rank 0 lets them go however `drive`
    ends. A device this host lacks raises `DeviceError` before any rank joins."""
    accel = resolve_learner(learner, dtype)
    world = launched_world()
    if world.sharded:
        world, accel = start_rank(accel)
        if not world.driver:
            return follow_driver(world, accel, dtype)
    try:
        return drive(world)
    finally:
        release(world)


def follow_driver(world: World, accel: Accel, dtype: str) -> int:
    """A rank other than 0: follow rank 0 until it stops, then leave."""
    try:
        follow(world, accel, dtype)
    finally:
        leave_world()
    return 0


def release(world: World) -> None:
    """Rank 0 is done, however it ends: the other ranks are let go, the group left."""
    if not world.sharded:
        return
    try:
        release_followers(world)
    finally:
        leave_world()

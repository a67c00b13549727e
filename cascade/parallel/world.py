"""Which rank this process is, of how many, and the collectives the losses need (a sum, and a
maximum for the metrics that are maxima).

A learner launched by `torchrun` finds `RANK`, `WORLD_SIZE` and `LOCAL_RANK` in its
environment; anything else is a world of one, with no process group and nothing to reduce.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from cascade.accel import Accel


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def sharded(self) -> bool:
        return self.size > 1

    @property
    def driver(self) -> bool:
        """Rank 0 runs the stage loop (store, rollouts, teachers, checkpoints' run state); the
        other ranks follow its commands."""
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over every rank (`cascade.algo.masking.SumOverRanks`); not differentiable,
        used for counts and metrics only."""
        if not self.sharded:
            return t
        out = t.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """`t`'s elementwise maximum over every rank (`cascade.algo.masking.MaxOverRanks`); not
        differentiable, used for metrics only."""
        if not self.sharded:
            return t
        out = t.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return out

    def place(self, accel: Accel) -> Accel:
        """The learner's device for this rank: on CUDA, one GPU per local rank."""
        if not self.sharded or accel.device.type != "cuda":
            return accel
        device = torch.device("cuda", self.local_rank)
        torch.cuda.set_device(device)
        return replace(accel, device=device)


def launched_world() -> World:
    """The world `torchrun` (or any launcher setting its variables) started this process in."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    return World(rank=int(os.environ["RANK"]), size=size, local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def join_world(world: World, *, cuda: bool, timeout_s: float = 1800.0) -> None:
    """The process group of `world` (gloo on CPU, NCCL on GPUs); nothing for a world of one.
    `timeout_s` bounds how long a rank waits in a collective for the others."""
    if not world.sharded or dist.is_initialized():
        return
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def leave_world() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

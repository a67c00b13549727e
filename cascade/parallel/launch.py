"""Starting the ranks and telling each what it is.

`cascade run --nproc N` and `cascade up --learner-ranks N` start the learner under
`torchrun --standalone` (one host); on a cluster the learner image's entry point runs torchrun
with a c10d rendezvous (deploy/). Under torchrun every rank parses the same command line: rank 0
runs the stage loop, the others `follow` it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence

from cascade.accel import Accel, resolve_learner
from cascade.config import LearnerConfig
from cascade.parallel.world import World, join_world, launched_world, leave_world


def torchrun_argv(nproc: int, module: str, args: Sequence[str], *, python: str | None = None) -> list[str]:
    """`module args` as `nproc` ranks on this host."""
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        *args,
    ]


def without_option(argv: Sequence[str], option: str) -> list[str]:
    """`argv` less `option VALUE` / `option=VALUE` (the ranks learn their number from torchrun,
    and torchrun would take `--nproc` as an abbreviation of its own `--nproc-per-node`)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def relaunch(nproc: int, module: str, args: Sequence[str]) -> int:
    """Run `module args` again as `nproc` ranks and wait; their exit code (torchrun ends every
    rank when one fails)."""
    return subprocess.call(torchrun_argv(nproc, module, args))


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


def start_rank(accel: Accel) -> tuple[World, Accel]:
    """This process's world (joined when sharded) and its device."""
    world = launched_world()
    join_world(world, cuda=accel.device.type == "cuda")
    return world, world.place(accel)


def follow_driver(world: World, accel: Accel, dtype: str) -> int:
    """A rank other than 0: follow rank 0 until it stops, then leave."""
    from cascade.parallel.sharded import follow

    try:
        follow(world, accel, dtype)
    finally:
        leave_world()
    return 0


def release(world: World) -> None:
    """Rank 0 is done, however it ends: the other ranks are let go, the group left."""
    if not world.sharded:
        return
    from cascade.parallel.sharded import release_followers

    try:
        release_followers(world)
    finally:
        leave_world()

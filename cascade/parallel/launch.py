"""Starting the ranks and telling each what it is.

`cascade run --nproc N` and `cascade up --learner-ranks N` start the learner under
`torchrun --standalone` (one host); on a cluster the learner image's entry point runs torchrun
with a c10d rendezvous (deploy/). Under torchrun every rank parses the same command line and
joins the process group (`start_rank`); what each rank then runs is its caller's to say (the
learner's entry tells rank 0 from the others).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from cascade.accel import Accel
from cascade.parallel.world import World, join_world, launched_world


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


def start_rank(accel: Accel) -> tuple[World, Accel]:
    """This process's world (joined when sharded) and its device."""
    world = launched_world()
    join_world(world, cuda=accel.device.type == "cuda")
    return world, world.place(accel)

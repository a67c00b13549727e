"""The policy sharded with FSDP2: each decoder block its own unit, then the root (embeddings,
final norm, LM head), over a one-dimensional mesh of every rank."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from transformers import PreTrainedModel

from cascade.accel import Accel
from cascade.parallel.world import World


def decoder_blocks(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The model's repeated blocks: the classes it names as never to be split across devices
    (`_no_split_modules`, e.g. `Qwen3DecoderLayer`)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no decoder blocks found to shard (_no_split_modules)")
    return blocks


def shard_policy(model: PreTrainedModel, world: World, accel: Accel) -> FSDPModule:
    """`model` sharded in place over every rank of `world`.

    On GPU with mixed precision, parameters are all-gathered in bfloat16 for compute while the
    float32 shards stay the master weights, and gradients are reduced in float32. Gradients are
    summed over the ranks, never averaged: each rank's loss is already its part of the global
    loss (`cascade.algo.masking.SumOverRanks`)."""
    mesh = init_device_mesh(accel.device.type, (world.size,))
    mp = MixedPrecisionPolicy()
    if accel.autocast_dtype is not None:
        mp = MixedPrecisionPolicy(param_dtype=accel.autocast_dtype, reduce_dtype=torch.float32)
    units = [fully_shard(block, mesh=mesh, mp_policy=mp) for block in decoder_blocks(model)]
    root = fully_shard(model, mesh=mesh, mp_policy=mp)
    for unit in [*units, root]:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return root

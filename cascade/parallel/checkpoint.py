"""Sharded training state with `torch.distributed.checkpoint` (DCP): every rank writes its own
shards of the model and optimizer into `<checkpoint>/dcp`, and any world size reads them back
(DCP reshards on load). The full weights are exported beside them as a model directory for
teachers, the rollout service and the final model (by the run loop's checkpoint writer).

A checkpoint written by a learner of one process (`optimizer.safetensors`, keyed by parameter
index) loads into a sharded learner too, and a sharded one into a learner of one process. The
same holds for the float32 master weights, when the model directory holds a narrower dtype: a
one-process checkpoint has them in `master.safetensors`, a sharded one in its `dcp/` shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file, load_model
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule

DCP_DIR = "dcp"
STATE_FILE = "runner_state.json"
"""A checkpoint's plain state (JSON): the runner's, and the optimizer's scalars and groups."""
OPTIM_FILE = "optimizer.safetensors"
"""A one-process checkpoint's optimizer tensors, keyed `<parameter index>.<field>`."""
MASTER_FILE = "master.safetensors"
"""A one-process checkpoint's float32 master weights (`safetensors.torch.save_model`), written
only when its model directory holds them in another dtype."""


def is_sharded(checkpoint: Path) -> bool:
    return (checkpoint / DCP_DIR).is_dir()


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, checkpoint: Path) -> None:
    """This rank's shards (collective: every rank calls it with the same `checkpoint`)."""
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, checkpoint_id=checkpoint / DCP_DIR)


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    """`checkpoint`'s optimizer state into `optimizer` (of `model`, sharded or whole), whatever
    world size wrote it. Collective when `model` is sharded."""
    if is_sharded(checkpoint):
        state = {"optim": get_optimizer_state_dict(model, optimizer)}
        # a whole model reads alone, even in a process that has a process group
        alone = not isinstance(model, FSDPModule)
        dcp.load(state, checkpoint_id=checkpoint / DCP_DIR, no_dist=alone)
        set_optimizer_state_dict(model, optimizer, state["optim"])
        return
    full = _unsharded_optimizer_state(model, checkpoint)
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def holds_rounded_weights(checkpoint: Path) -> bool:
    """Whether `checkpoint`'s model directory holds some floating-point weight narrower than
    float32 (`model.dtype` bfloat16 or float16): its master weights are then elsewhere."""
    files = sorted(checkpoint.glob("model*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if f.get_slice(name).get_dtype() in ("BF16", "F16"):
                    return True
    return False


def load_master_weights(model: torch.nn.Module, checkpoint: Path) -> bool:
    """`checkpoint`'s float32 master weights into a whole `model` (a sharded learner's ranks
    each read them before sharding), when its model directory rounds them: from the `dcp/`
    shards of a sharded learner's checkpoint, or `MASTER_FILE` of a one-process one. False when
    there is nothing to read: the model directory's weights are the master weights, or it is a
    plain model directory (e.g. a bfloat16 Qwen3 checkpoint that starts a run)."""
    if isinstance(model, FSDPModule):
        raise TypeError("load_master_weights: the whole model, before it is sharded")
    if not holds_rounded_weights(checkpoint):
        return False
    if is_sharded(checkpoint):
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=checkpoint / DCP_DIR, no_dist=True)
        set_model_state_dict(model, state["model"])
        return True
    if (checkpoint / MASTER_FILE).exists():
        load_model(model, checkpoint / MASTER_FILE, strict=True)  # every weight, or an error naming them
        return True
    return False


def _unsharded_optimizer_state(model: torch.nn.Module, checkpoint: Path) -> dict[str, Any]:
    """A one-process checkpoint's optimizer state, keyed by parameter name instead of index
    (the index is the parameter's place in `model.parameters()`, which sharding keeps)."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    meta = json.loads((checkpoint / STATE_FILE).read_text())["optimizer"]
    if meta is None:
        raise ValueError(f"{checkpoint}: holds no optimizer state")
    state: dict[str, dict[str, Any]] = {}
    for key, value in load_file(str(checkpoint / OPTIM_FILE)).items():
        pid, field = key.split(".", 1)
        state.setdefault(names[int(pid)], {})[field] = value
    for key, value in meta["scalars"].items():
        pid, field = key.split(".", 1)
        state.setdefault(names[int(pid)], {})[field] = value
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}

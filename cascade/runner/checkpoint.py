"""Resumable checkpoints: model weights, optimizer state and RNG state as safetensors, plus
the runner's plain state as JSON. A checkpoint directory is also a loadable Hugging Face
checkpoint (teachers and the rollout service load it with `from_pretrained`). Tensors are
written from CPU copies whatever device the learner trains on, so a checkpoint made on a GPU
resumes on the CPU and back.

The model directory holds the weights in the checkpoint's dtype (`Policy.save_dtype`, the run's
`model.dtype`: what teachers, references and rollout replicas load), while the policy trains on
float32 master weights (`cascade.model.loading.MASTER_DTYPE`). When the two differ, a resumable
checkpoint also holds the master weights (`MASTER_FILE`; a sharded learner's are its `dcp/`
shards), so a run resumes from the weights it stopped at, not their rounding.

A checkpoint is written to a temporary directory and renamed into place, so a crash while
writing never leaves a half checkpoint that `--resume` would pick up.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file, save_model

from cascade.model.loading import DTYPES, MASTER_DTYPE, Policy
from cascade.parallel.checkpoint import MASTER_FILE, OPTIM_FILE, STATE_FILE

RNG_FILE = "rng.safetensors"


def save_model_dir(policy: Policy, path: Path) -> None:
    """A loadable model directory, its weights (and config.json's `dtype`) in `policy.save_dtype`."""
    path.mkdir(parents=True, exist_ok=True)
    if _needs_cast(policy):
        assert policy.save_dtype is not None
        state = _cast_state_dict(policy.model, DTYPES[policy.save_dtype])
        policy.model.save_pretrained(path, state_dict=state, safe_serialization=True)
        # save_pretrained wrote the parameters' dtype; the file holds save_dtype (vLLM's `auto` reads it)
        config = copy.deepcopy(policy.model.config)
        config.dtype = policy.save_dtype
        config.save_pretrained(path)
    else:
        policy.model.save_pretrained(path, safe_serialization=True)
    policy.tokenizer.save_pretrained(path)


def _needs_cast(policy: Policy) -> bool:
    """Whether some floating-point weight is held in another dtype than the one it is saved in."""
    if policy.save_dtype is None:
        return False
    want = DTYPES[policy.save_dtype]
    return any(t.is_floating_point() and t.dtype != want for t in policy.model.state_dict().values())


def _cast_state_dict(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's state as CPU copies in `dtype` (floating-point tensors only). Tensors that
    share storage (an LM head tied to the embedding) stay one tensor, so `save_pretrained` still
    writes it once."""
    out: dict[str, torch.Tensor] = {}
    copies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            out[name] = t
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if key not in copies:
            copies[key] = t.detach().to(device="cpu", dtype=dtype)
        out[name] = copies[key]
    return out


def save_model_dir_atomically(policy: Policy, path: Path) -> None:
    """A model directory (a teacher, the KL reference) written next to `path` and renamed into
    place: a write cut short (ENOSPC, a kill) never leaves a directory that looks complete,
    which a resumed run would load as it is."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model_dir(policy, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def _optimizer_tensors(optim: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optim.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, pstate in state["state"].items():
        for key, value in pstate.items():
            name = f"{pid}.{key}"
            if torch.is_tensor(value):
                tensors[name] = value.detach().cpu().clone().contiguous()  # a CPU copy, from any device
            else:
                scalars[name] = value
    return tensors, {"scalars": scalars, "param_groups": state["param_groups"]}


def _load_optimizer(
    optim: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    optim.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    path: Path,
    *,
    policy: Policy,
    optimizer: torch.optim.Optimizer | None,
    generator: torch.Generator,
    runner_state: dict[str, Any],
    write_shards: Callable[[Path], None] | None = None,
) -> None:
    """`optimizer` None: its state is written by `write_shards(directory)` (a sharded learner's
    ranks each write theirs), or there is none (between stages)."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        save_model_dir(policy, tmp)
        if _needs_cast(policy) and policy.save_dtype != MASTER_DTYPE:
            # the model directory rounds the master weights: the exact ones beside it
            save_model(policy.model, str(tmp / MASTER_FILE))
        meta: dict[str, Any] | None = None
        if optimizer is not None:
            tensors, meta = _optimizer_tensors(optimizer)
            save_file(tensors, str(tmp / OPTIM_FILE))
        if write_shards is not None:
            write_shards(tmp)
        save_file(
            {"generator": generator.get_state(), "torch_cpu": torch.get_rng_state()},
            str(tmp / RNG_FILE),
        )
        (tmp / STATE_FILE).write_text(json.dumps({"runner": runner_state, "optimizer": meta}, indent=1))
    except BaseException:  # e.g. ENOSPC: the half-written `.tmp` goes, the last checkpoint stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def load_checkpoint_state(
    path: Path, *, optimizer: torch.optim.Optimizer | None, generator: torch.Generator
) -> dict[str, Any]:
    """Restore optimizer (None: leave it fresh) and RNG state (the weights are loaded by the
    trainer's `load(path)`, master weights included)."""
    blob = json.loads((path / STATE_FILE).read_text())
    if optimizer is not None:
        _load_optimizer(optimizer, load_file(str(path / OPTIM_FILE)), blob["optimizer"])
    rng = load_file(str(path / RNG_FILE))
    _set_generator_state(generator, rng["generator"])
    torch.set_rng_state(rng["torch_cpu"])
    return blob["runner"]


def _set_generator_state(generator: torch.Generator, state: torch.Tensor) -> None:
    """The saved sampling stream; saved on another device type (a CPU run resumed on a GPU or
    back), whose state does not fit this generator, the generator is seeded from it instead:
    still deterministic, but not the stream the other device would have drawn."""
    if state.numel() == generator.get_state().numel():
        generator.set_state(state)
        return
    digest = hashlib.sha256(state.numpy().tobytes()).digest()
    generator.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def read_runner_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())["runner"]


def _complete_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first (a `.tmp` directory is a write that never finished)."""
    if not root.exists():
        return []
    return sorted(
        p
        for p in root.glob("step-*")
        if p.is_dir() and not p.name.endswith(".tmp") and (p / STATE_FILE).exists()
    )


def latest_checkpoint(root: Path) -> Path | None:
    done = _complete_checkpoints(root)
    return done[-1] if done else None


def prune_checkpoints(root: Path, keep_last: int) -> None:
    for old in _complete_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)

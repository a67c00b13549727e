"""Read new policy weights and decide whether they fit the served model, before any switch.

A weight update is all-or-nothing: every check here runs on the incoming tensors while the old
weights keep serving, and any failure raises `WeightUpdateError` with a message naming the
checkpoint and what is wrong (unreadable file, other architecture, missing or unknown tensor,
wrong shape, NaN/inf values).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from cascade.engine.base import WeightUpdateError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

ARCHITECTURE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
    "tie_word_embeddings",
)
"""config.json fields that must agree between the served model and new weights."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


def _files(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix != ".safetensors":
            raise WeightUpdateError(f"{path}: not a .safetensors file")
        return [path]
    if not path.is_dir():
        raise WeightUpdateError(f"{path}: no such checkpoint (file or directory)")
    if (path / SINGLE_FILE).exists():
        return [path / SINGLE_FILE]
    if (path / INDEX_FILE).exists():
        try:
            weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as err:
            raise WeightUpdateError(f"{path / INDEX_FILE}: unreadable shard index ({err})") from None
        return [path / name for name in sorted(set(weight_map.values()))]
    raise WeightUpdateError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} (not a safetensors checkpoint)")


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint (directory, sharded directory or one file), on the CPU."""
    tensors: dict[str, torch.Tensor] = {}
    for file in _files(Path(path)):
        try:
            part = load_file(str(file))
        except Exception as err:  # safetensors raises its own error types for damaged files
            raise WeightUpdateError(f"{file}: unreadable safetensors file ({err})") from None
        tensors.update(part)
    return tensors


def iter_checkpoint(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's tensors one at a time (file by file), without holding them all."""
    for file in _files(Path(path)):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def header_specs(path: str | Path) -> dict[str, TensorSpec]:
    """Names, shapes and dtypes of a checkpoint's tensors from the file headers (no data read)."""
    specs: dict[str, TensorSpec] = {}
    for file in _files(Path(path)):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                sl = f.get_slice(name)
                specs[name] = TensorSpec(tuple(sl.get_shape()), _dtype_of(sl.get_dtype()))
    return specs


def _dtype_of(name: str) -> torch.dtype:
    return {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}.get(name, torch.float32)


def read_config(path: str | Path) -> dict[str, Any] | None:
    """The checkpoint's config.json, or None when it has none (a bare .safetensors file)."""
    p = Path(path)
    cfg = p / "config.json" if p.is_dir() else p.parent / "config.json"
    if not cfg.exists():
        return None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError) as err:
        raise WeightUpdateError(f"{cfg}: unreadable config ({err})") from None
    if not isinstance(data, dict):
        raise WeightUpdateError(f"{cfg}: not a JSON object")
    return data


def check_config(served: Mapping[str, Any], incoming: Mapping[str, Any] | None, source: str) -> None:
    if incoming is None:
        return
    for key in ARCHITECTURE_KEYS:
        if key in served and key in incoming and served[key] != incoming[key]:
            raise WeightUpdateError(
                f"{source}: mismatched checkpoint: config {key} is {incoming[key]!r}, "
                f"the served model has {served[key]!r}"
            )


def model_specs(model: torch.nn.Module) -> tuple[dict[str, TensorSpec], set[str]]:
    """The model's state-dict specs, and the names that may be absent because they are tied to
    another tensor (e.g. `lm_head.weight` sharing the embedding)."""
    specs: dict[str, TensorSpec] = {}
    tied: set[str] = set()
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=False).items():
        specs[name] = TensorSpec(tuple(t.shape), t.dtype)
        ptr = t.data_ptr()
        if ptr in seen:
            tied.add(name)
        seen.add(ptr)
    return specs, tied


def check_tensors(
    expected: Mapping[str, TensorSpec],
    tensors: Mapping[str, torch.Tensor],
    source: str,
    optional: set[str] | frozenset[str] = frozenset(),
) -> int:
    """Refuse tensors that would not load cleanly; returns their total bytes."""
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise WeightUpdateError(
            f"{source}: mismatched checkpoint: {len(unknown)} tensor(s) the served model does not "
            f"have, e.g. {unknown[:3]}"
        )
    missing = sorted(set(expected) - set(tensors) - set(optional))
    if missing:
        raise WeightUpdateError(
            f"{source}: incomplete checkpoint: {len(missing)} missing, e.g. {missing[:3]}"
        )
    total = 0
    for name, t in tensors.items():
        spec = expected[name]
        if tuple(t.shape) != spec.shape:
            raise WeightUpdateError(
                f"{source}: mismatched checkpoint: {name} has shape {tuple(t.shape)}, expected {spec.shape}"
            )
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise WeightUpdateError(f"{source}: corrupted checkpoint: {name} holds NaN or inf values")
        total += t.numel() * t.element_size()
    return total


def tensor_from_bytes(name: str, dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    """One streamed tensor (raw little-endian, row-major), checked for a consistent size."""
    if dtype not in DTYPES:
        raise WeightUpdateError(f"{name}: dtype {dtype!r} not one of {sorted(DTYPES)}")
    if any(d < 0 for d in shape):
        raise WeightUpdateError(f"{name}: negative dimension in shape {shape}")
    torch_dtype = DTYPES[dtype]
    numel = 1
    for d in shape:
        numel *= d
    want = numel * torch.empty((), dtype=torch_dtype).element_size()
    if len(data) != want:
        raise WeightUpdateError(f"{name}: {len(data)} bytes for shape {shape} {dtype} ({want} expected)")
    if numel == 0:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(bytearray(data), dtype=torch_dtype).reshape(shape)


def embedding_rows(model: torch.nn.Module) -> int:
    """The input embedding's row count: valid token ids are [0, rows)."""
    weight = model.get_input_embeddings().weight  # type: ignore[operator]
    assert isinstance(weight, torch.Tensor)
    return int(weight.shape[0])

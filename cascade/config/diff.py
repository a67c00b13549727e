"""What in a cascade config changes training, its hash, and how two configs differ in it.

The control plane stores the config a cascade was created with; a runner that joins the cascade
with its own YAML must train that config. Settings that change nothing about the updates
(where outputs go, how often checkpoints are written, the runner's lease) may differ.

Paths are compared resolved (`cascade.config.paths.resolve_path`, from the runner's working
directory): the control plane stores them resolved, a YAML may name the same directory
relatively, and a diff shows what each side resolves to.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cascade.config.cascade import CascadeConfig
from cascade.config.paths import config_paths, resolve_path

NOT_TRAINING = ("output_dir", "checkpoint", "lease", "learner", "resilience", "tracking")
"""Top-level sections that change where or how safely a run is kept, not what it learns.

`learner` (device and precision) is here on purpose: a cascade made on a laptop may be trained
on a GPU node, and a run may resume on another device. It changes the numerics only by rounding
(bfloat16 autocast on CUDA, see `cascade.accel`), not the algorithm or its settings. `tracking`
(experiment trackers) only says where metrics are copied to."""


def training_settings(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in NOT_TRAINING}


def training_hash(config: dict[str, Any]) -> str:
    """sha256 of the training settings, canonical JSON (sorted keys)."""
    blob = json.dumps(training_settings(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = value


def _path_fields(*configs: dict[str, Any]) -> set[str]:
    """The dotted fields that hold paths in any of `configs` (one that does not validate: none)."""
    fields: set[str] = set()
    for config in configs:
        try:
            fields.update(p.field for p in config_paths(CascadeConfig.model_validate(config)))
        except ValidationError:
            pass
    return fields


def _resolved(value: Any, base: Path) -> Path | None:
    if not isinstance(value, str):
        return None
    try:
        return resolve_path(value, base)
    except ValueError:
        return None


def training_diff(stored: dict[str, Any], given: dict[str, Any], base: Path | None = None) -> list[str]:
    """`field: stored X, given Y` for each training setting that differs (dotted paths). Paths
    are compared resolved from `base` (default: the working directory), and shown with what
    they resolve to when that differs from how they are written."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(training_settings(stored), "", a)
    _flatten(training_settings(given), "", b)
    paths = _path_fields(stored, given)
    base = Path.cwd() if base is None else base
    missing = object()
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, missing), b.get(key, missing)
        if x == y:
            continue
        resolved = [_resolved(v, base) if key in paths else None for v in (x, y)]
        if resolved[0] is not None and resolved[0] == resolved[1]:
            continue  # the same file, written two ways
        show = ["(absent)" if v is missing else json.dumps(v, default=str) for v in (x, y)]
        for i, (v, r) in enumerate(zip((x, y), resolved, strict=True)):
            if r is not None and str(r) != v:
                show[i] += f" (resolves to {r})"
        out.append(f"{key}: cascade has {show[0]}, the config has {show[1]}")
    return out

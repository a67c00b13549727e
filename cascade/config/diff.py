"""What in a cascade config changes training, its hash, and how two configs differ in it.

The control plane stores the config a cascade was created with; a runner that joins the cascade
with its own YAML must train that config. Settings that change nothing about the updates
(where outputs go, how often checkpoints are written, the runner's lease) may differ.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

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


def training_diff(stored: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """`field: stored X, given Y` for each training setting that differs (dotted paths)."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(training_settings(stored), "", a)
    _flatten(training_settings(given), "", b)
    missing = object()
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, missing), b.get(key, missing)
        if x != y:
            show = ["(absent)" if v is missing else json.dumps(v, default=str) for v in (x, y)]
            out.append(f"{key}: cascade has {show[0]}, the config has {show[1]}")
    return out

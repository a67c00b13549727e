"""Fixtures shared by the test tree: database URLs for the store tests.

Nothing here connects or imports a driver at import time; a Postgres test connects only when it
asks for `postgres_url`, and gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_schema import fresh_schema


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cascade.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL whose search_path is a fresh schema on the local Postgres (dropped after the test)."""
    with fresh_schema("test") as url:
        yield url


@pytest.fixture(scope="session")
def random_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RANDOM (untrained) tiny Qwen3 model + trained tokenizer: the fast plumbing fixture.

    Built once per session in a couple of seconds; tests must not write into it.
    """
    from cascade.bootstrap.policy import TinyModelSpec, save_untrained_model

    return save_untrained_model(tmp_path_factory.mktemp("random-tiny-model"), TinyModelSpec(seed=0))


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread for this module, then restore the previous setting.

    The tiny model is far too small to gain from threads, and on a small shared machine
    two spinning threads competing with another process make each forward many times slower.
    """
    from cascade.accel import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture
def torch_two_threads() -> Iterator[None]:
    """Two intra-op threads for one test (whatever the module set): for what only shows when
    torch splits a kernel across threads."""
    from cascade.accel import torch_threads

    with torch_threads(2):
        yield


@pytest.fixture(scope="session")
def tiny_checkpoints(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Variants of the random tiny model for weight updates and teachers (never written to):

    - `base`: the random tiny model itself; `perturbed1`, `perturbed2`: its weights plus noise
      (loadable model directories: several "teachers", or "new policy weights");
    - refused updates: `truncated` (model.safetensors cut in half), `garbage` (not safetensors),
      `wrong_shape` (a smaller MLP, same config), `wrong_config` (config says 5 layers),
      `nan` (one tensor NaN), `missing` (a layer's tensor left out), `empty` (no weights file).
    """
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("tiny-checkpoints")
    base = random_tiny_model
    weights = load_file(str(base / "model.safetensors"))

    def variant(name: str, tensors: dict[str, torch.Tensor] | None, config: dict | None = None) -> Path:
        out = root / name
        shutil.copytree(base, out)
        if tensors is not None:
            save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        if config is not None:
            (out / "config.json").write_text(json.dumps(config))
        return out

    gen = torch.Generator().manual_seed(1)
    out: dict[str, Path] = {"base": base}
    for k in (1, 2):
        noisy = {n: t + 0.05 * k * torch.randn(t.shape, generator=gen) for n, t in weights.items()}
        out[f"perturbed{k}"] = variant(f"perturbed{k}", noisy)
    out["truncated"] = variant("truncated", None)
    blob = (base / "model.safetensors").read_bytes()
    (out["truncated"] / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    out["garbage"] = variant("garbage", None)
    (out["garbage"] / "model.safetensors").write_bytes(b"not a safetensors file" * 100)
    mlp = next(n for n in weights if n.endswith("mlp.up_proj.weight"))
    out["wrong_shape"] = variant("wrong_shape", {**weights, mlp: weights[mlp][:-8].clone()})
    config = json.loads((base / "config.json").read_text())
    out["wrong_config"] = variant("wrong_config", None, {**config, "num_hidden_layers": 5})
    out["nan"] = variant("nan", {**weights, mlp: torch.full_like(weights[mlp], float("nan"))})
    out["missing"] = variant("missing", {n: t for n, t in weights.items() if n != mlp})
    out["empty"] = variant("empty", None)
    (out["empty"] / "model.safetensors").unlink()
    return out


@pytest.fixture
def popen_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every process started in this test process (the count must stay 0)."""
    calls: list[Any] = []
    real = subprocess.Popen

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append(args[0] if args else kwargs.get("args"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Counting)
    yield calls

"""Saved model directories are readable by whoever the umask lets read them (a container's
service user included): safetensors alone writes its file 0600."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import save_file

from cascade.bootstrap.policy import save_untrained_model
from cascade.model.files import as_umask_allows


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir() if p.is_file()}


def test_safetensors_alone_writes_owner_only(tmp_path: Path, umask_022: None) -> None:
    """Why the module exists (fails the day safetensors honours the umask: then drop it)."""
    import torch

    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    assert _modes(tmp_path)["model.safetensors"] == 0o600


def test_an_initialised_model_is_world_readable(tmp_path: Path, umask_022: None) -> None:
    modes = _modes(save_untrained_model(tmp_path / "m"))
    assert modes["model.safetensors"] == 0o644
    assert set(modes.values()) == {0o644}


def test_the_umask_decides(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("a", "sub/b"):
        (tmp_path / name).write_text("x")
        (tmp_path / name).chmod(0o600)
    old = os.umask(0o027)
    try:
        as_umask_allows(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "sub/b").stat().st_mode) == 0o640

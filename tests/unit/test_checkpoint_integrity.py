"""Checkpoints that prove themselves (issue 34): each carries a manifest of its files' sizes and
sha256; a resume takes the newest one whose files match it, whose weights are finite and whose
optimizer state is not zeroed, and says in one line which it skipped and why; none verifying is
a one-line `RunDirError`. Pruning never deletes the last checkpoint that verifies, and a write
the disk refuses is a one-line `CheckpointWriteError` that leaves the checkpoints before it."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.api import CheckpointException

from cascade.model.loading import Policy, load_policy
from cascade.parallel.checkpoint import MASTER_FILE, OPTIM_FILE, STATE_FILE
from cascade.runner import checkpoint
from cascade.runner.checkpoint import (
    MANIFEST_FILE,
    CheckpointWriteError,
    latest_checkpoint,
    newest_verified_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    verify_checkpoint,
    write_manifest,
)
from cascade.runner.run_state import RunDirError

pytestmark = pytest.mark.usefixtures("torch_one_thread")

MODEL = "model.safetensors"


def _train(policy: Policy, optim: torch.optim.Optimizer, n: int) -> None:
    ids = torch.tensor([[1, 5, 9, 17, 33, 65], [2, 4, 8, 16, 32, 64]])
    policy.model.train()
    for _ in range(n):
        optim.zero_grad(set_to_none=True)
        policy.model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optim.step()


def _save(path: Path, policy: Policy, optim: torch.optim.Optimizer | None, step: int) -> None:
    runner = {"global_step": step, "stage_step": step, "stage_started": True}
    save_checkpoint(path, policy=policy, optimizer=optim, generator=torch.Generator(), runner_state=runner)


@pytest.fixture(scope="module")
def good_root(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sound checkpoints of a trained tiny model, step-000004 and step-000008 (copied, never
    written to)."""
    torch.manual_seed(0)
    policy = load_policy(random_tiny_model)
    optim = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    root = tmp_path_factory.mktemp("integrity") / "checkpoints"
    _train(policy, optim, 2)
    _save(root / "step-000004", policy, optim, 4)
    _train(policy, optim, 2)
    _save(root / "step-000008", policy, optim, 8)
    return root


@pytest.fixture
def root(good_root: Path, tmp_path: Path) -> Path:
    out = tmp_path / "checkpoints"
    shutil.copytree(good_root, out)
    return out


def _resume(root: Path) -> tuple[Path | None, list[str]]:
    lines: list[str] = []
    return newest_verified_checkpoint(root, lines.append), lines


def _rewrite(file: Path, change: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> None:
    save_file(change(load_file(str(file))), str(file), metadata={"format": "pt"})


# --------------------------------------------------------------------------- the manifest


def test_the_manifest_lists_every_file_with_its_size_and_sha256(root: Path) -> None:
    path = root / "step-000008"
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["version"] == 1 and manifest["hash"] == "sha256"
    on_disk = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert sorted(manifest["files"]) == [n for n in on_disk if n != MANIFEST_FILE]
    assert {MODEL, STATE_FILE, OPTIM_FILE, "config.json", "rng.safetensors"} <= set(manifest["files"])
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert verify_checkpoint(path) is None


def test_the_manifest_covers_what_write_shards_left(
    random_tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest is written after `write_shards` returns (when every rank's `dcp/` shards
    are there: `torch.distributed.checkpoint.save` gathers every rank's write before it returns),
    so it lists them; a shard cut afterwards fails verification."""
    policy = load_policy(random_tiny_model)

    def shards(directory: Path) -> None:
        (directory / "dcp").mkdir()
        for rank in range(2):
            (directory / "dcp" / f"__{rank}_0.distcp").write_bytes(os.urandom(1000 + rank))
        (directory / "dcp" / ".metadata").write_bytes(b"meta")

    path = tmp_path / "step-000002"
    runner = {"global_step": 2, "stage_step": 2, "stage_started": True}
    save_checkpoint(
        path,
        policy=policy,
        optimizer=None,
        generator=torch.Generator(),
        runner_state=runner,
        write_shards=shards,
    )
    files = json.loads((path / MANIFEST_FILE).read_text())["files"]
    assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp", "dcp/.metadata"} <= set(files)
    assert verify_checkpoint(path) is None
    with (path / "dcp" / "__1_0.distcp").open("r+b") as f:
        f.truncate(10)
    assert verify_checkpoint(path) == "dcp/__1_0.distcp is 10 bytes, manifest says 1,001"


# --------------------------------------------------------------------------- damage, and the fallback


def test_a_truncated_model_file_falls_back_to_the_previous_checkpoint(root: Path) -> None:
    model = root / "step-000008" / MODEL
    size = model.stat().st_size
    with model.open("r+b") as f:
        f.truncate(size // 2)
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert lines == [
        f"step-000008: {MODEL} is {size // 2:,} bytes, manifest says {size:,}: skipped; "
        "resuming from step-000004"
    ]


def test_an_empty_model_file_falls_back(root: Path) -> None:
    model = root / "step-000008" / MODEL
    size = model.stat().st_size
    model.write_bytes(b"")
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert lines == [
        f"step-000008: {MODEL} is 0 bytes, manifest says {size:,}: skipped; resuming from step-000004"
    ]


def test_a_file_changed_in_place_fails_its_checksum(root: Path) -> None:
    model = root / "step-000008" / MODEL
    data = bytearray(model.read_bytes())
    data[-5] ^= 0xFF  # same size, one bit pattern off
    model.write_bytes(bytes(data))
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert f"step-000008: {MODEL} does not match its checksum in the manifest: skipped" in lines[0]


def test_a_cut_state_file_falls_back(root: Path) -> None:
    state = root / "step-000008" / STATE_FILE
    text = state.read_text()
    state.write_text(text[: len(text) // 2])
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert len(lines) == 1 and lines[0].startswith(f"step-000008: {STATE_FILE} is ")


def test_a_cut_state_file_without_a_manifest_falls_back(root: Path) -> None:
    """A checkpoint written before checksums: judged by reading its files back."""
    path = root / "step-000008"
    (path / MANIFEST_FILE).unlink()
    text = (path / STATE_FILE).read_text()
    (path / STATE_FILE).write_text(text[: len(text) // 2])
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert lines[0].startswith(f"step-000008: {STATE_FILE} cannot be read (")
    assert lines[0].endswith(": skipped; resuming from step-000004")


def test_a_truncated_model_file_without_a_manifest_falls_back(root: Path) -> None:
    path = root / "step-000008"
    (path / MANIFEST_FILE).unlink()
    with (path / MODEL).open("r+b") as f:
        f.truncate(100)
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert lines[0].startswith(f"step-000008: {MODEL} cannot be read (")


def test_a_cut_manifest_falls_back(root: Path) -> None:
    manifest = root / "step-000008" / MANIFEST_FILE
    manifest.write_text(manifest.read_text()[:100])
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert lines[0].startswith(f"step-000008: {MANIFEST_FILE} cannot be read (")


def test_a_checkpoint_without_a_manifest_is_taken_when_it_reads_back(root: Path) -> None:
    """The choice for checkpoints of older code: accepted, with one line saying so, when every
    file reads and the weights are finite."""
    (root / "step-000008" / MANIFEST_FILE).unlink()
    found, lines = _resume(root)
    assert found == root / "step-000008"
    assert lines == [
        f"step-000008 has no {MANIFEST_FILE} (written before checksums), its files read back; "
        "resuming from step-000008"
    ]


def test_a_sound_newest_checkpoint_is_taken_silently(root: Path) -> None:
    assert _resume(root) == (root / "step-000008", [])


def test_a_zeroed_optimizer_state_falls_back(root: Path) -> None:
    """Zeros written as the optimizer's state (the manifest matches them): every AdamW state
    counts at least one step, and the runner state says 8 were taken."""
    path = root / "step-000008"
    _rewrite(path / OPTIM_FILE, lambda ts: {k: torch.zeros_like(v) for k, v in ts.items()})
    write_manifest(path)
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert lines == [
        f"step-000008: {OPTIM_FILE} is all zeros, but the runner state says 8 steps were taken: skipped; "
        "resuming from step-000004"
    ]


def test_an_optimizer_without_state_between_stages_is_sound(random_tiny_model: Path, tmp_path: Path) -> None:
    """Between stages the checkpoint holds a placeholder optimizer that never stepped."""
    policy = load_policy(random_tiny_model)
    optim = torch.optim.AdamW(policy.model.parameters(), lr=1e-4)
    path = tmp_path / "step-000004"
    runner = {"global_step": 4, "stage_step": 0, "stage_started": False}
    save_checkpoint(path, policy=policy, optimizer=optim, generator=torch.Generator(), runner_state=runner)
    assert verify_checkpoint(path) is None


def test_nan_weights_fall_back(root: Path, good_root: Path) -> None:
    """Weights that are not finite, written as they were (the manifest matches them)."""
    path = root / "step-000008"
    name = next(n for n in load_file(str(path / MODEL)) if n.endswith("mlp.up_proj.weight"))
    _rewrite(path / MODEL, lambda ts: {**ts, name: torch.full_like(ts[name], float("nan"))})
    write_manifest(path)
    found, lines = _resume(root)
    assert found == root / "step-000004"
    assert lines == [f"step-000008: {MODEL}: {name} holds NaN: skipped; resuming from step-000004"]


def test_infinite_master_weights_fall_back(root: Path) -> None:
    path = root / "step-000008"
    weights = load_file(str(path / MODEL))
    name = next(iter(weights))
    weights[name][0] = float("inf")
    save_file(weights, str(path / MASTER_FILE), metadata={"format": "pt"})
    write_manifest(path)
    assert verify_checkpoint(path) == f"{MASTER_FILE}: {name} holds inf"


def test_none_verifying_is_one_line_naming_the_files(root: Path) -> None:
    (root / "step-000008" / MODEL).write_bytes(b"")
    (root / "step-000004" / STATE_FILE).unlink()
    with pytest.raises(RunDirError) as err:
        _resume(root)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"no checkpoint in {root} verifies (step-000008: {MODEL} is 0 bytes, manifest says "
    )
    assert f"step-000004: {STATE_FILE} is missing (the manifest lists it)" in message
    assert message.endswith("restore one, or start over with --fresh")


def test_no_checkpoint_at_all_is_none(tmp_path: Path) -> None:
    assert _resume(tmp_path / "missing") == (None, [])
    assert _resume(tmp_path) == (None, [])


# --------------------------------------------------------------------------- names and pruning


def test_only_exact_step_names_are_checkpoints(root: Path) -> None:
    """A staging or temporary directory, complete as it may be, is never taken for one."""
    for name in ("step-000010.e3.staged", "step-000012.tmp", "step-000014-old", "step-14"):
        shutil.copytree(root / "step-000008", root / name)
    assert latest_checkpoint(root) == root / "step-000008"
    assert _resume(root) == (root / "step-000008", [])
    prune_checkpoints(root, keep_last=1)
    assert sorted(p.name for p in root.iterdir()) == [
        "step-000008",
        "step-000010.e3.staged",
        "step-000012.tmp",
        "step-000014-old",
        "step-14",
    ]


def test_a_step_past_six_digits_still_orders_by_step(root: Path) -> None:
    shutil.copytree(root / "step-000004", root / "step-1000000")
    assert latest_checkpoint(root) == root / "step-1000000"


def test_prune_never_deletes_the_last_checkpoint_that_verifies(root: Path) -> None:
    """Two newer checkpoints of NaN weights (a run that diverged): the older sound one stays."""
    for step in (12, 16):
        path = root / f"step-{step:06d}"
        shutil.copytree(root / "step-000008", path)
        _rewrite(path / MODEL, lambda ts: {k: torch.full_like(v, float("nan")) for k, v in ts.items()})
        write_manifest(path)
    prune_checkpoints(root, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step-000008", "step-000012", "step-000016"]
    assert _resume(root)[0] == root / "step-000008"
    shutil.copytree(root / "step-000008", root / "step-000020")  # a sound one again: the rest goes
    prune_checkpoints(root, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step-000016", "step-000020"]


# --------------------------------------------------------------------------- a write the disk refuses


@pytest.mark.parametrize(
    "error",
    [
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    ],
    ids=["safetensors", "oserror"],
)
def test_a_full_disk_is_one_line_and_leaves_the_last_checkpoint(
    root: Path, random_tiny_model: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(checkpoint, "save_file", full)
    policy = load_policy(random_tiny_model)
    with pytest.raises(CheckpointWriteError) as err:
        _save(root / "step-000012.e1.staged", policy, None, 12)
    assert err.value.errno == errno.ENOSPC
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{root / 'step-000012'} could not be written: No space left on device; ")
    assert message.endswith(" MiB free on its disk")
    assert sorted(p.name for p in root.iterdir()) == ["step-000004", "step-000008"]  # no .tmp left
    assert _resume(root) == (root / "step-000008", [])


def test_a_rank_whose_shards_the_disk_cut_short_is_one_line(root: Path, random_tiny_model: Path) -> None:
    """`torch.distributed.checkpoint` reports a full disk as some rank's `RuntimeError` of
    torch.save's stream, inside a multi-line `CheckpointException` (a BaseException)."""
    cut = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    def shards(directory: Path) -> None:
        raise CheckpointException("write", {1: (cut, traceback.StackSummary())})

    runner = {"global_step": 12, "stage_step": 12, "stage_started": True}
    with pytest.raises(CheckpointWriteError) as err:
        save_checkpoint(
            root / "step-000012",
            policy=load_policy(random_tiny_model),
            optimizer=None,
            generator=torch.Generator(),
            runner_state=runner,
            write_shards=shards,
        )
    assert str(err.value).startswith(
        f"{root / 'step-000012'} could not be written: rank 1: a shard's write came up short; "
    )
    assert sorted(p.name for p in root.iterdir()) == ["step-000004", "step-000008"]


def test_a_teacher_cut_short_by_a_full_disk_is_one_line(
    random_tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(policy: Policy, path: Path) -> None:
        path.mkdir(parents=True)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_model_dir", full)
    target = tmp_path / "teachers" / "if-g000004"
    with pytest.raises(
        CheckpointWriteError, match="if-g000004 could not be written: No space left on device"
    ):
        checkpoint.save_model_dir_atomically(load_policy(random_tiny_model), target)
    assert list((tmp_path / "teachers").iterdir()) == []

"""Resumable checkpoints: weights + optimizer + RNG + runner state round-trip exactly, and only
complete checkpoint directories are ever picked up or kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from cascade.model.loading import Policy, load_policy
from cascade.runner.checkpoint import (
    STATE_FILE,
    latest_checkpoint,
    load_checkpoint_state,
    prune_checkpoints,
    read_runner_state,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")

RUNNER_STATE = {
    "stage_index": 1,
    "stage_step": 3,
    "global_step": 7,
    "tracker": {"streak": 1, "last_step": 2, "history": [[2, 0.5]]},
    "teachers": {"teachers": {"if": {"path": "/x/if-g000004", "score": 0.25, "step": 4}}},
    "py_rng": [3, [1, 2, 3], None],
    "finished": False,
    "note": "ünïcode ok",
}


def _loss(policy: Policy) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 9, 17, 33, 65], [2, 4, 8, 16, 32, 64]])
    return policy.model(input_ids=ids, labels=ids, use_cache=False).loss


def _steps(policy: Policy, optim: torch.optim.Optimizer, n: int) -> None:
    policy.model.train()
    for _ in range(n):
        optim.zero_grad(set_to_none=True)
        _loss(policy).backward()
        optim.step()


def _optimizer(policy: Policy) -> torch.optim.AdamW:
    return torch.optim.AdamW(policy.model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.8, 0.95))


def _params(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}


@pytest.fixture
def trained(random_tiny_model: Path) -> tuple[Policy, torch.optim.AdamW]:
    torch.manual_seed(0)
    policy = load_policy(random_tiny_model)
    optim = _optimizer(policy)
    _steps(policy, optim, 3)
    return policy, optim


def test_round_trip(tmp_path: Path, trained: tuple[Policy, torch.optim.AdamW]) -> None:
    policy, optim = trained
    gen = torch.Generator().manual_seed(42)
    torch.rand(5, generator=gen)  # not at its seed any more
    torch.manual_seed(1234)
    torch.rand(3)
    path = tmp_path / "ckpt" / "step-000007"
    save_checkpoint(path, policy=policy, optimizer=optim, generator=gen, runner_state=RUNNER_STATE)
    assert not path.with_name(path.name + ".tmp").exists()
    assert (path / STATE_FILE).exists()

    # What the original objects produce next.
    want_gen = torch.rand(4, generator=gen)
    want_cpu = torch.rand(4)

    # A fresh process's view: weights from the directory, state from the files.
    restored = load_policy(path)
    for key, value in _params(policy).items():
        assert torch.equal(restored.model.state_dict()[key], value), key
    optim2 = _optimizer(restored)
    optim2.param_groups[0]["lr"] = 0.5  # must be overwritten by the checkpoint
    gen2 = torch.Generator().manual_seed(999)
    torch.manual_seed(999)
    runner = load_checkpoint_state(path, optimizer=optim2, generator=gen2)
    assert runner == RUNNER_STATE
    assert read_runner_state(path) == RUNNER_STATE
    assert torch.equal(torch.rand(4, generator=gen2), want_gen)
    assert torch.equal(torch.rand(4), want_cpu)

    # Optimizer state: every moment tensor and step count, and the hyper-parameters.
    s1, s2 = optim.state_dict(), optim2.state_dict()
    assert len(s1["state"]) == len(s2["state"]) == len(list(policy.model.parameters()))
    for pid, st in s1["state"].items():
        assert set(st) == set(s2["state"][pid])
        for key, value in st.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(s2["state"][pid][key])), (pid, key)
        assert float(st["step"]) == 3.0
    g1, g2 = s1["param_groups"][0], s2["param_groups"][0]
    assert g2["lr"] == g1["lr"] == 1e-3
    assert tuple(g2["betas"]) == (0.8, 0.95)
    assert g2["weight_decay"] == 0.01

    # The strongest check: one more step from each gives identical weights.
    _steps(policy, optim, 1)
    _steps(restored, optim2, 1)
    for key, value in _params(policy).items():
        assert torch.allclose(restored.model.state_dict()[key], value, atol=1e-7, rtol=0), key


def test_fresh_optimizer_would_differ(tmp_path: Path, trained: tuple[Policy, torch.optim.AdamW]) -> None:
    """Guards the round-trip test: without the saved state the next step is different."""
    policy, optim = trained
    path = tmp_path / "step-000003"
    save_checkpoint(path, policy=policy, optimizer=optim, generator=torch.Generator(), runner_state={})
    restored = load_policy(path)
    _steps(policy, optim, 1)
    _steps(restored, _optimizer(restored), 1)
    diffs = [float((restored.model.state_dict()[k] - v).abs().max()) for k, v in _params(policy).items()]
    assert max(diffs) > 1e-6


def test_overwrite_existing_checkpoint(tmp_path: Path, trained: tuple[Policy, torch.optim.AdamW]) -> None:
    policy, optim = trained
    path = tmp_path / "step-000001"
    gen = torch.Generator()
    save_checkpoint(path, policy=policy, optimizer=optim, generator=gen, runner_state={"v": 1})
    (path.with_name(path.name + ".tmp")).mkdir()  # a leftover from a crash
    (path.with_name(path.name + ".tmp") / "junk").write_text("x")
    save_checkpoint(path, policy=policy, optimizer=optim, generator=gen, runner_state={"v": 2})
    assert read_runner_state(path) == {"v": 2}
    assert not path.with_name(path.name + ".tmp").exists()


def test_checkpoint_dir_is_a_loadable_model(
    tmp_path: Path, trained: tuple[Policy, torch.optim.AdamW]
) -> None:
    policy, optim = trained
    path = tmp_path / "step-000002"
    save_checkpoint(path, policy=policy, optimizer=optim, generator=torch.Generator(), runner_state={})
    # another user (a container's service user) may read the weights the umask lets it read
    umask = os.umask(0)
    os.umask(umask)
    assert (path / "model.safetensors").stat().st_mode & 0o777 == (0o666 & ~umask) | 0o600
    loaded = load_policy(path)
    assert loaded.tokenizer.chat_template == policy.tokenizer.chat_template
    assert loaded.eos_token_ids == policy.eos_token_ids
    assert loaded.pad_token_id == policy.pad_token_id
    ids = torch.tensor([[1, 7, 11, 13]])
    with torch.no_grad():
        policy.model.eval()
        a = policy.model(input_ids=ids).logits
        b = loaded.model(input_ids=ids).logits
    assert torch.equal(a, b)


# --------------------------------------------------------------------------- which checkpoint


def _fake_checkpoint(root: Path, name: str, complete: bool = True) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"")
    if complete:
        (path / STATE_FILE).write_text(json.dumps({"runner": {"name": name}, "optimizer": {}}))
    return path


def test_latest_checkpoint_none(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None


def test_latest_checkpoint_ignores_half_written(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, "step-000002")
    _fake_checkpoint(tmp_path, "step-000010")
    _fake_checkpoint(tmp_path, "step-000012", complete=False)  # crashed while writing
    (tmp_path / "step-000014").write_text("not a directory")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000010"


def test_latest_checkpoint_ignores_tmp_dir(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, "step-000004")
    # save_checkpoint writes here and renames: a crash before the rename leaves it, complete.
    _fake_checkpoint(tmp_path, "step-000006.tmp")
    _fake_checkpoint(tmp_path, "step-000008.tmp", complete=False)
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000004"


def test_latest_checkpoint_orders_by_step(tmp_path: Path) -> None:
    for step in (9, 10, 100, 99):
        _fake_checkpoint(tmp_path, f"step-{step:06d}")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000100"


def test_prune_keeps_last_n(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8, 10):
        _fake_checkpoint(tmp_path, f"step-{step:06d}")
    _fake_checkpoint(tmp_path, "step-000012", complete=False)
    prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000008", "step-000010", "step-000012"]
    prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000008", "step-000010", "step-000012"]
    prune_checkpoints(tmp_path, keep_last=1)
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000010"
    assert not (tmp_path / "step-000008").exists()


def test_prune_never_counts_tmp_dirs(tmp_path: Path) -> None:
    for step in (2, 4):
        _fake_checkpoint(tmp_path, f"step-{step:06d}")
    _fake_checkpoint(tmp_path, "step-000006.tmp")
    prune_checkpoints(tmp_path, keep_last=2)
    assert (tmp_path / "step-000002").exists() and (tmp_path / "step-000004").exists()

"""Float32 master weights whatever the checkpoint's dtype (`model.dtype`).

The arithmetic these tests rest on: AdamW's first step moves every weight whose gradient is
nonzero by about the learning rate (m / sqrt(v) is the gradient's sign), here 1e-5. bfloat16
keeps 8 significant bits, so a weight w moves only if 1e-5 is more than half its spacing,
|w| * 2**-8: only |w| < ~2.6e-3. The random tiny model's weights are N(0, 0.02) and its norms
1.0, so a bfloat16 policy keeps its update in about one weight in six (measured: 15.6%), a
float32 one (spacing |w| * 2**-23) in all of them (the tied LM head gives every embedding row
a gradient). A bfloat16 checkpoint must therefore train in float32 on the CPU and be saved
back as bfloat16, with the exact float32 weights beside it for resuming.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from cascade.accel import Accel, resolve_learner
from cascade.config import LearnerConfig, StageConfig
from cascade.model.loading import load_policy
from cascade.parallel.checkpoint import MASTER_FILE, load_master_weights, save_shards
from cascade.runner.training import LocalTrainer

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LR = 1e-5


@pytest.fixture(scope="module")
def bf16_model(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random tiny Qwen3 as a bfloat16 checkpoint, written by transformers alone (what a
    downloaded bf16 Qwen3 directory is)."""
    out = tmp_path_factory.mktemp("tiny-bf16")
    policy = load_policy(random_tiny_model, "bfloat16")
    policy.model.save_pretrained(out, safe_serialization=True)
    policy.tokenizer.save_pretrained(out)
    assert _file_dtypes(out / "model.safetensors") == {"BF16"}
    return out


def _accel(dtype: str) -> Accel:
    """`precision: auto` on the CPU: float32 compute, no autocast."""
    accel = resolve_learner(LearnerConfig(device="cpu"), dtype, cuda=False)
    assert accel.autocast_dtype is None
    return accel


def _stage() -> StageConfig:
    return StageConfig.model_validate({"domain": "math", "grpo": {"learning_rate": LR, "weight_decay": 0.0}})


def _file_dtypes(path: Path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return {f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118 - not a mapping


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step on a fixed language-modelling loss (a nonzero gradient everywhere)."""
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 129, 200], [2, 4, 8, 16, 32, 64, 128, 256]])
    model.train()
    optimizer.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    optimizer.step()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _changed_share(before: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    changed = total = 0
    for name, p in model.named_parameters():
        changed += int((p.detach() != before[name]).sum())
        total += p.numel()
    return changed / total


@pytest.fixture
def stepped(bf16_model: Path) -> tuple[LocalTrainer, dict[str, torch.Tensor]]:
    """The trainer of a `model.dtype: bfloat16` run after one step at lr 1e-5, and its weights
    before the step."""
    trainer = LocalTrainer(_accel("bfloat16"), "bfloat16")
    trainer.load(bf16_model)
    trainer.start_stage(_stage())
    before = _weights(trainer.policy.model)
    assert trainer.optimizer is not None
    _step(trainer.policy.model, trainer.optimizer)
    return trainer, before


def test_a_bf16_checkpoint_trains_on_float32_master_weights(
    stepped: tuple[LocalTrainer, dict[str, torch.Tensor]],
) -> None:
    trainer, before = stepped
    model = trainer.policy.model
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert trainer.optimizer is not None
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert _changed_share(before, model) > 0.99


def test_the_same_step_on_bf16_parameters_loses_most_of_it(bf16_model: Path) -> None:
    """Guards the test above: the old path (the policy loaded in `model.dtype`, AdamW on its
    bfloat16 parameters) keeps the update in a minority of the weights."""
    policy = load_policy(bf16_model, "bfloat16")
    before = _weights(policy.model)
    _step(policy.model, torch.optim.AdamW(policy.model.parameters(), lr=LR, weight_decay=0.0))
    assert _changed_share(before, policy.model) < 0.5


def test_the_checkpoint_is_bf16_on_disk_and_loads(
    stepped: tuple[LocalTrainer, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    trainer, _ = stepped
    path = tmp_path / "step-000001"
    trainer.save(path, generator=torch.Generator().manual_seed(0), runner_state={"step": 1})
    assert _file_dtypes(path / "model.safetensors") == {"BF16"}
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    assert _file_dtypes(path / MASTER_FILE) == {"F32"}
    # what a teacher, a KL reference or a rollout replica loads: the master weights, rounded
    served = load_policy(path, "bfloat16").model.state_dict()
    for name, master in trainer.policy.model.state_dict().items():
        assert torch.equal(served[name], master.to(torch.bfloat16)), name
    # the trainer's own copy is untouched by the save
    assert {p.dtype for p in trainer.policy.model.parameters()} == {torch.float32}


def test_resuming_restores_the_exact_master_weights_and_the_next_step(
    stepped: tuple[LocalTrainer, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    trainer, _ = stepped
    path = tmp_path / "step-000001"
    trainer.save(path, generator=torch.Generator().manual_seed(0), runner_state={})
    master = trainer.policy.model.state_dict()
    rounded = load_policy(path, "float32").model.state_dict()
    assert any(not torch.equal(rounded[k], v) for k, v in master.items())  # bf16 alone would not do

    resumed = LocalTrainer(_accel("bfloat16"), "bfloat16")
    resumed.load(path)
    for name, value in resumed.policy.model.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, master[name]), name
    resumed.start_stage(_stage())
    resumed.restore(path, optimizer=True, generator=torch.Generator())
    assert trainer.optimizer is not None and resumed.optimizer is not None
    _step(trainer.policy.model, trainer.optimizer)
    _step(resumed.policy.model, resumed.optimizer)
    after = resumed.policy.model.state_dict()
    for name, value in trainer.policy.model.state_dict().items():
        assert torch.equal(after[name], value), name


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # DCP in one process
def test_a_sharded_checkpoints_master_weights_come_from_its_shards(
    stepped: tuple[LocalTrainer, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    """A sharded learner's checkpoint has no master file: its `dcp/` shards hold the float32
    weights (written here from the whole model, with the names FSDP2 keeps)."""
    trainer, _ = stepped
    path = tmp_path / "step-000002"
    trainer.save(path, generator=torch.Generator(), runner_state={})
    (path / MASTER_FILE).unlink()
    save_shards(trainer.policy.model, trainer.optimizer, path)
    model = load_policy(path, "float32").model
    assert load_master_weights(model, path)
    for name, value in trainer.policy.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def test_a_float32_run_writes_what_it_wrote_before(random_tiny_model: Path, tmp_path: Path) -> None:
    """`model.dtype: float32` (every run until now): float32 on disk, no master file, and the
    model directory's weights are already the exact ones."""
    trainer = LocalTrainer(_accel("float32"), "float32")
    trainer.load(random_tiny_model)
    trainer.start_stage(_stage())
    assert trainer.optimizer is not None
    _step(trainer.policy.model, trainer.optimizer)
    path = tmp_path / "step-000001"
    trainer.save(path, generator=torch.Generator(), runner_state={})
    assert _file_dtypes(path / "model.safetensors") == {"F32"}
    assert not (path / MASTER_FILE).exists()
    assert not load_master_weights(load_policy(path).model, path)
    reloaded = load_policy(path).model.state_dict()
    for name, value in trainer.policy.model.state_dict().items():
        assert torch.equal(reloaded[name], value), name


def test_a_plain_bf16_model_directory_has_no_master_weights(bf16_model: Path) -> None:
    """The checkpoint a run starts from: rounded weights and nothing beside them."""
    model = load_policy(bf16_model, "float32").model
    assert not load_master_weights(model, bf16_model)

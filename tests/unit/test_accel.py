"""The learner's device and precision (`learner.device`, `learner.precision`, `--device`).

On this CPU-only host: `auto` resolves to the CPU in float32 with no autocast (the CPU path
bit for bit as before), a CUDA device is refused naming the field, and a real runner step
(RL with a KL reference + distillation from a local teacher) touches tensors on the model's
device only. The CUDA path itself is checked by `bench/gpu_check.sh` where a GPU is present.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from cascade.accel import DeviceError, resolve_device, resolve_learner
from cascade.config import (
    ConfigError,
    LearnerConfig,
    device_setting,
    load_cascade_config,
    parse_cascade_config,
    with_learner_device,
)
from cascade.config.diff import training_hash

BASE: dict[str, Any] = {
    "name": "dev",
    "model": {"path": "/nonexistent"},
    "domains": [{"name": "if", "prompts": {"kind": "synthetic"}}],
    "stages": [{"domain": "if"}],
}


def test_defaults_are_auto_and_auto_resolves_to_the_cpu_here() -> None:
    cfg = parse_cascade_config(BASE)
    assert cfg.learner.device == "auto" and cfg.learner.precision == "auto"
    accel = resolve_learner(cfg.learner, cfg.model.dtype, cuda=False)
    assert accel.device == torch.device("cpu")
    assert accel.autocast_dtype is None and accel.frozen_dtype == "float32"
    assert accel.precision == "float32"
    gen = accel.generator(3)
    assert gen.device.type == "cpu"
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(3).get_state())
    if not torch.cuda.is_available():  # this machine: detection itself says cpu
        assert resolve_learner(cfg.learner, "float32").device == torch.device("cpu")


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_a_cuda_device_without_cuda_is_refused_naming_the_field(device: str) -> None:
    with pytest.raises(DeviceError, match=r"learner\.device: .*no CUDA device"):
        resolve_learner(LearnerConfig(device=device), "float32", cuda=False)


def test_bfloat16_on_the_cpu_is_refused_naming_the_field() -> None:
    with pytest.raises(DeviceError, match=r"learner\.precision"):
        resolve_learner(LearnerConfig(device="cpu", precision="bfloat16"), "float32", cuda=False)


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CPU", "cuda:0:1", "mps"])
def test_a_malformed_device_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"learner\.device"):
        parse_cascade_config({**BASE, "learner": {"device": bad}})
    with pytest.raises(ValueError):
        device_setting(bad)
    with pytest.raises(DeviceError, match="learner.device"):
        resolve_device(bad, cuda=False)


def test_device_override_and_the_training_hash() -> None:
    cfg = parse_cascade_config({**BASE, "learner": {"device": "cpu", "precision": "float32"}})
    moved = with_learner_device(cfg, "cuda:1")
    assert moved.learner.device == "cuda:1" and moved.learner.precision == "float32"
    assert with_learner_device(cfg, None) is cfg
    # not a training setting: a cascade may be trained, or resumed, on another device
    assert training_hash(cfg.model_dump(mode="json")) == training_hash(moved.model_dump(mode="json"))


def test_cascade_run_with_cuda_here_fails_before_writing(
    tmp_path: Path, random_tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    from cascade.cli.main import main

    path = _config(tmp_path, random_tiny_model)
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--device", "cuda", "--run-dir", str(run_dir), "--no-progress"]) == 2
    assert "learner.device: 'cuda'" in capsys.readouterr().err
    assert not run_dir.exists()
    with pytest.raises(SystemExit):
        main(["run", str(path), "--device", "gpu"])


def _config(tmp_path: Path, model: Path) -> Path:
    import yaml

    prompts = {"kind": "synthetic", "seed": 0, "n_train": 8, "n_eval": 2}
    small = {"group_size": 2, "prompts_per_step": 2, "budget": {"max_new_tokens": 6}}
    data = {
        "name": "accel",
        "model": {"path": str(model)},
        "learner": {"device": "auto"},
        "domains": [{"name": "if", "prompts": prompts}, {"name": "math", "prompts": prompts}],
        "stages": [
            {
                "domain": "if",
                "grpo": {**small, "kl_coef": 0.1},
                "filter": {"drop_zero_variance": False},
                "advance": {"max_steps": 1},
                "eval": {"every": 100, "n_prompts": 2, "max_new_tokens": 4},
            },
            {
                "domain": "math",
                "grpo": small,
                "filter": {"drop_zero_variance": False},
                "distill": {"loss": "topk", "topk": 4, "prompts_per_teacher": 2},
                "advance": {"max_steps": 1},
                "eval": {"every": 100, "n_prompts": 2, "max_new_tokens": 4},
            },
        ],
        "output_dir": str(tmp_path / "runs"),
    }
    path = tmp_path / "cascade.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class DeviceLog(TorchFunctionMode):
    """Every device a tensor argument or result of a torch call had, while active."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: set[torch.device] = set()
        self.calls = 0

    def _note(self, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.devices.add(value.device)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self._note(v)
        elif isinstance(value, dict):
            for v in value.values():
                self._note(v)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.calls += 1
        self._note(args)
        self._note(kwargs)
        out = func(*args, **kwargs)
        self._note(out)
        return out


def test_every_tensor_of_a_step_is_on_the_model_device(
    tmp_path: Path, random_tiny_model: Path, monkeypatch: pytest.MonkeyPatch, torch_one_thread: None
) -> None:
    """A real cascade (RL with a KL reference, then RL + top-k distillation from the first
    stage's teacher): the loss, the distillation terms and the update run under a mode that
    records every tensor's device; all of them are the policy's."""
    import cascade.runner.update as update
    from cascade.runner.embedded import embedded_runner

    cfg = load_cascade_config(_config(tmp_path, random_tiny_model))
    runner = embedded_runner(cfg, run_dir=tmp_path / "run", log=lambda _: None)
    log = DeviceLog()
    seen: list[str] = []

    def logged(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            with log:
                return fn(*args, **kwargs)

        return wrapper

    for name in ("rl_loss", "distill_terms", "apply_update"):
        monkeypatch.setattr(update, name, logged(name, getattr(update, name)))
    try:
        result = runner.run()
    finally:
        runner.close()
    assert result.finished
    device = runner.policy.model.device
    assert runner.accel.device == device == torch.device("cpu")
    assert {p.device for p in runner.policy.model.parameters()} == {device}
    assert seen.count("rl_loss") == 2 and seen.count("apply_update") == 2
    assert log.calls > 100
    assert log.devices == {device}
    teacher = next(iter(runner.sources.teachers.frozen._models.values()))  # type: ignore[attr-defined]
    assert teacher.device == device and next(teacher.parameters()).dtype == torch.float32
    reference = next(iter(runner.trainer.frozen._models.values()))  # type: ignore[attr-defined]
    assert reference.device == device


def test_the_learner_takes_device(tmp_path: Path) -> None:
    from services.learner.main import parse_args

    path = tmp_path / "c.yaml"
    path.write_text("name: x\n")
    args = parse_args([str(path), "--rollout", "127.0.0.1:1", "--device", "cuda:1"])
    assert args.device == "cuda:1"
    assert parse_args([str(path), "--rollout", "127.0.0.1:1"]).device is None
    with pytest.raises(SystemExit):
        parse_args([str(path), "--rollout", "127.0.0.1:1", "--device", "gpu"])

"""Bounds on configs that would exhaust the machine (`cascade.runner.step_memory`): a step whose
estimated memory is more than the learner has is refused by `cascade validate` and by
`cascade run` before anything is written, naming the field to change and a value that fits
(`learner.micro_batch_tokens`, `learner.activation_checkpointing`, more ranks, or the stage's
field); `learner.memory_gib` overrides the machine. The estimate's arithmetic is checked in
`test_step_estimate.py`. And what exhausts the machine anyway: a checkpoint that hits a full
disk leaves no `.tmp`, and the run's crash (as any database, disk or Redis error's) prints the
command that resumes it."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.config import CascadeConfig
from cascade.runner.step_memory import GIB, ModelShape, StagePrecision, estimate_stages, step_memory_problems

REPO = Path(__file__).resolve().parents[2]

QWEN3_0_6B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": True,
}
QWEN3_8B = {
    **QWEN3_0_6B,
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "tie_word_embeddings": False,
}
QWEN3_14B = {
    **QWEN3_8B,
    "hidden_size": 5120,
    "num_hidden_layers": 40,
    "intermediate_size": 17408,
    "num_attention_heads": 40,
}


def data(model: Path, tmp_path: Path, **grpo: Any) -> dict[str, Any]:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 16, "n_eval": 4}
    return {
        "name": "bounds",
        "model": {"path": str(model)},
        "domains": [{"name": "math", "prompts": prompts}],
        "stages": [{"domain": "math", "grpo": {"budget": {"max_new_tokens": 8}, **grpo}}],
        "output_dir": str(tmp_path / "runs"),
    }


def shaped_model(tmp_path: Path, config: dict[str, Any]) -> Path:
    """A model directory with only a `config.json`: all the estimate reads."""
    path = tmp_path / f"model-{config['hidden_size']}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def recipe(model: Path, tmp_path: Path, *, completion: int = 8192, **learner: Any) -> CascadeConfig:
    """The Nemotron-Cascade RL recipe's step (128 prompts x group 8, `completion`-token
    completions) for a learner on an 80 GiB GPU (`memory_gib`: the check on any machine), in
    bfloat16 autocast (`device: cuda`)."""
    cfg = data(model, tmp_path, group_size=8, prompts_per_step=128)
    cfg["domains"][0]["prompts"]["n_train"] = 128
    cfg["stages"][0]["grpo"]["budget"] = {"max_new_tokens": completion}
    cfg["model"]["dtype"] = "bfloat16"  # the checkpoint's (Qwen3's own): rank 0's generating copy
    cfg["learner"] = {"device": "cuda", "memory_gib": 80, **learner}
    return CascadeConfig.model_validate(cfg)


def test_examples_fit_and_a_trillion_completions_do_not(random_tiny_model: Path, tmp_path: Path) -> None:
    for example in sorted((REPO / "examples").glob("*.yaml")):
        cfg = CascadeConfig.model_validate(
            {**yaml.safe_load(example.read_text()), "model": {"path": str(random_tiny_model)}}
        )
        assert step_memory_problems(cfg) == [], example
    cfg = CascadeConfig.model_validate(data(random_tiny_model, tmp_path, group_size=1_000_000_000_000))
    [problem] = step_memory_problems(cfg)
    # micro-batches cannot help: the step's own token tensors are too big
    assert problem.startswith("stages.0.grpo.group_size: ") and "GiB" in problem
    assert "learner.memory_gib" in problem  # how a bigger machine gets past it


def test_the_field_named_is_the_one_that_makes_it_fit(random_tiny_model: Path, tmp_path: Path) -> None:
    def problem(cfg: dict[str, Any]) -> str:
        [out] = step_memory_problems(CascadeConfig.model_validate({**cfg, "learner": {"memory_gib": 1}}))
        return out

    big_budget = data(random_tiny_model, tmp_path)
    big_budget["stages"][0]["grpo"]["budget"] = {"max_new_tokens": 10_000_000}
    assert problem(big_budget).startswith("stages.0.grpo.budget.max_new_tokens: ")
    many_prompts = data(random_tiny_model, tmp_path, prompts_per_step=10**9)
    assert step_memory_problems(CascadeConfig.model_validate(many_prompts)) == []  # 16 train prompts
    many_prompts["domains"][0]["prompts"]["n_train"] = 10**9
    assert problem(many_prompts).startswith("stages.0.grpo.prompts_per_step: ")
    # a step too big for one pass, but not for micro-batches: the setting, with a value that fits
    long = data(random_tiny_model, tmp_path)  # 16 x 8 sequences of 8224 tokens
    long["stages"][0]["grpo"]["budget"] = {"max_new_tokens": 8192}
    said = problem(long)
    assert said.startswith("learner.micro_batch_tokens: ")
    value = int(re.findall(r"learner\.micro_batch_tokens: (\d+)", said)[-1])
    assert "learner.activation_checkpointing: true" in said
    fixed = {**long, "learner": {"memory_gib": 1, "micro_batch_tokens": value}}
    assert step_memory_problems(CascadeConfig.model_validate(fixed)) == []


def test_each_stage_counts_its_frozen_models_and_the_teachers_data(
    random_tiny_model: Path, tmp_path: Path
) -> None:
    cfg = data(random_tiny_model, tmp_path)
    cfg["domains"].append({"name": "code", "prompts": {"kind": "synthetic", "seed": 1, "n_train": 16}})
    cfg["stages"].append({"domain": "code", "grpo": {"budget": {"max_new_tokens": 8}, "kl_coef": 0.1}})
    config = CascadeConfig.model_validate(cfg)
    shape = ModelShape.read(random_tiny_model)
    assert shape is not None
    precision = StagePrecision.of(config, cuda=False)  # float32 everywhere
    first, second = estimate_stages(config, shape, precision)
    assert first.frozen == 0 and first.distill_sequences == 0 and first.gradient_snapshot == 0
    # the KL reference and math's teacher, each a float32 copy; math's 16 prompts x 1 sample
    assert second.frozen == 2 * 4 * shape.params()
    assert second.distill_sequences == 16 and second.gradient_snapshot == 4 * shape.params()
    assert second.teacher_data == 16 * 8 * 8  # sampled: two float32 log-probs a position
    served = estimate_stages(config, shape, precision, local_teachers=False)[1]
    assert served.frozen == 4 * shape.params()  # the distributed learner asks the teacher service
    cfg["stages"][1]["distill"] = {"loss": "full"}
    full = estimate_stages(CascadeConfig.model_validate(cfg), shape, precision)[1]
    assert full.teacher_data == 16 * 8 * 4 * shape.vocab
    bf16 = estimate_stages(config, shape, StagePrecision.of(config, cuda=True))[1]
    assert bf16.frozen == 2 * 2 * shape.params() and bf16.weight_copies == 2 * shape.params()


def test_memory_gib_overrides_the_machine(random_tiny_model: Path, tmp_path: Path) -> None:
    big = data(random_tiny_model, tmp_path, group_size=200_000)
    config = CascadeConfig.model_validate(big)
    shape = ModelShape.read(random_tiny_model)
    assert shape is not None
    need = estimate_stages(config, shape, StagePrecision.of(config, cuda=False))[0].total
    assert (
        step_memory_problems(CascadeConfig.model_validate({**big, "learner": {"memory_gib": 2 * need / GIB}}))
        == []
    )
    [problem] = step_memory_problems(
        CascadeConfig.model_validate({**big, "learner": {"memory_gib": need / GIB / 2}})
    )
    assert "of learner.memory_gib" in problem and "needs about" in problem
    half = CascadeConfig.model_validate({**big, "learner": {"memory_gib": need / GIB / 2}})
    assert step_memory_problems(half, ranks=16) == []  # each rank trains one group of the 16


def test_qwen3_0_6b_at_the_recipes_batch_fits_80_gib_in_micro_batches(tmp_path: Path) -> None:
    model = shaped_model(tmp_path, QWEN3_0_6B)
    fits = recipe(model, tmp_path, micro_batch_tokens=16384, activation_checkpointing=True)
    assert step_memory_problems(fits) == []
    # the whole step of 1024 sequences of 8224 tokens in one pass: refused, with what fits
    [problem] = step_memory_problems(recipe(model, tmp_path))
    assert problem.startswith("learner.micro_batch_tokens: a step of stage 0 needs about ")
    assert "1024 sequences of 8224 tokens in one pass" in problem and "of learner.memory_gib" in problem
    without, with_checkpointing = re.findall(r"learner\.micro_batch_tokens: (\d+)", problem)
    assert "learner.activation_checkpointing: true with learner.micro_batch_tokens" in problem
    assert int(with_checkpointing) > int(without) >= 8224  # at least one sequence, more with it
    for value, checkpointing in ((without, False), (with_checkpointing, True)):
        cfg = recipe(model, tmp_path, micro_batch_tokens=int(value), activation_checkpointing=checkpointing)
        assert step_memory_problems(cfg) == []  # the suggestion fits
        one_more = recipe(
            model, tmp_path, micro_batch_tokens=int(value) + 8224, activation_checkpointing=checkpointing
        )
        assert step_memory_problems(one_more) != []  # and is the largest that does
    # one 32K sequence without checkpointing is over 80 GiB: the setting is checkpointing
    [problem] = step_memory_problems(recipe(model, tmp_path, completion=32768, micro_batch_tokens=16384))
    assert problem.startswith("learner.activation_checkpointing: ")
    assert "set learner.activation_checkpointing: true (1 sequence a micro-batch" in problem


@pytest.mark.parametrize(("config", "ranks"), [(QWEN3_8B, 3), (QWEN3_14B, 7)])
def test_8b_and_14b_need_the_sharded_learner(tmp_path: Path, config: dict[str, Any], ranks: int) -> None:
    """16 bytes a parameter of float32 state: 122 GiB for 8B, 220 GiB for 14B, more than any one
    GPU. Refused on one 80 GiB GPU naming the model and the ranks it needs; fits on them."""
    model = shaped_model(tmp_path, config)
    cfg = recipe(model, tmp_path, micro_batch_tokens=16384, activation_checkpointing=True)
    [problem] = step_memory_problems(cfg)
    assert problem.startswith("model.path: ")
    assert f"shard the learner over at least {ranks} GPUs" in problem
    assert f"`cascade run --nproc {ranks}`" in problem
    assert step_memory_problems(cfg, ranks=ranks) == []
    [problem] = step_memory_problems(cfg, ranks=ranks - 1)
    assert "per rank of" in problem


def test_validate_and_run_refuse_it_before_anything_is_written(
    random_tiny_model: Path, tmp_path: Path
) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(data(random_tiny_model, tmp_path, group_size=1_000_000_000_000)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    for argv in (["validate", str(path)], ["run", str(path), "--no-progress"]):
        done = subprocess.run(
            [sys.executable, "-m", "cascade.cli", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, (argv, done.stderr)
        assert "stages.0.grpo.group_size: a step of stage 0 needs about" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_checkpoint_that_runs_out_of_disk_leaves_no_tmp(
    random_tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from cascade.model.loading import load_policy
    from cascade.runner import checkpoint

    policy = load_policy(random_tiny_model, "float32")
    gen = torch.Generator().manual_seed(0)
    root = tmp_path / "checkpoints"
    checkpoint.save_checkpoint(
        root / "step-000001", policy=policy, optimizer=None, generator=gen, runner_state={}
    )

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "save_file", full)
    with pytest.raises(OSError) as err:
        checkpoint.save_checkpoint(
            root / "step-000002", policy=policy, optimizer=None, generator=gen, runner_state={}
        )
    assert err.value.errno == errno.ENOSPC
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]  # no .tmp; the last one intact
    assert checkpoint.latest_checkpoint(root) == root / "step-000001"


def test_a_run_whose_checkpoint_hits_a_full_disk_prints_the_resume_command(
    random_tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cascade.cli.main import main
    from cascade.runner import checkpoint

    cfg = data(random_tiny_model, tmp_path, group_size=2, prompts_per_step=2)
    cfg["stages"][0]["advance"] = {"max_steps": 3}
    cfg["stages"][0]["eval"] = {"every": 1000, "n_prompts": 2}
    cfg["checkpoint"] = {"every": 1, "keep_last": 2}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    real, calls = checkpoint.save_file, []

    def fills_up(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) > 2:  # the second checkpoint: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", fills_up)
    run_dir = tmp_path / "runs" / "bounds"
    assert main(["run", str(path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err
    assert f"cascade run {path} --resume --run-dir {run_dir}" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]  # no .tmp
    monkeypatch.setattr(checkpoint, "save_file", real)  # space freed: the hint continues the run
    assert main(["run", str(path), "--resume", "--run-dir", str(run_dir), "--no-progress"]) == 0


def test_outages_are_told_from_bugs() -> None:
    import redis
    from sqlalchemy.exc import OperationalError

    from cascade.cli.run import _is_outage
    from cascade.resilience import DependencyDown

    assert _is_outage(OSError(errno.ENOSPC, "No space left on device"))
    assert _is_outage(OperationalError("SELECT 1", {}, Exception("server closed the connection")))
    assert _is_outage(DependencyDown("database", ConnectionError("refused"), 300))
    assert _is_outage(redis.exceptions.ConnectionError("Connection refused"))
    assert not _is_outage(ValueError("a bug")) and not _is_outage(KeyError("x"))


def test_a_teacher_or_reference_cut_short_leaves_nothing_that_looks_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.runner import checkpoint

    def half_then_full(policy: Any, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")  # what a resumed run would take for a model
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "save_model_dir", half_then_full)
    target = tmp_path / "references" / "stage-0"
    with pytest.raises(OSError):
        checkpoint.save_model_dir_atomically(object(), target)  # type: ignore[arg-type]
    assert not target.exists() and list((tmp_path / "references").iterdir()) == []

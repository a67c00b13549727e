"""Bounds on configs that would exhaust the machine (`cascade.runner.step_memory`): a step that
certainly needs more memory than the learner has is refused by `cascade validate` and by
`cascade run` before anything is written, naming the field; `learner.memory_gib` overrides.
And what exhausts the machine anyway: a checkpoint that hits a full disk leaves no `.tmp`, and
the run's crash (as any database, disk or Redis error's) prints the command that resumes it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.config import CascadeConfig
from cascade.runner.step_memory import GIB, ModelShape, estimate_steps, step_memory_problems

REPO = Path(__file__).resolve().parents[2]


def data(model: Path, tmp_path: Path, **grpo: Any) -> dict[str, Any]:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 16, "n_eval": 4}
    return {
        "name": "bounds",
        "model": {"path": str(model)},
        "domains": [{"name": "math", "prompts": prompts}],
        "stages": [{"domain": "math", "grpo": {"budget": {"max_new_tokens": 8}, **grpo}}],
        "output_dir": str(tmp_path / "runs"),
    }


def test_examples_fit_and_a_trillion_completions_do_not(random_tiny_model: Path, tmp_path: Path) -> None:
    for example in sorted((REPO / "examples").glob("*.yaml")):
        cfg = CascadeConfig.model_validate(
            {**yaml.safe_load(example.read_text()), "model": {"path": str(random_tiny_model)}}
        )
        assert step_memory_problems(cfg) == [], example
    cfg = CascadeConfig.model_validate(data(random_tiny_model, tmp_path, group_size=1_000_000_000_000))
    [problem] = step_memory_problems(cfg)
    assert problem.startswith("stages.0.grpo.group_size: ") and "GiB" in problem
    assert "learner.memory_gib" in problem  # how a bigger machine gets past it


def test_the_field_named_is_the_one_furthest_above_its_default(
    random_tiny_model: Path, tmp_path: Path
) -> None:
    shape = ModelShape.read(random_tiny_model)
    assert shape is not None
    big_budget = data(random_tiny_model, tmp_path)
    big_budget["stages"][0]["grpo"]["budget"] = {"max_new_tokens": 10_000_000}
    [est] = estimate_steps(CascadeConfig.model_validate(big_budget), shape)
    assert est.field == "stages.0.grpo.budget.max_new_tokens"
    many_prompts = data(random_tiny_model, tmp_path, prompts_per_step=10**9)
    capped = estimate_steps(CascadeConfig.model_validate(many_prompts), shape)[0]
    assert capped.bytes < GIB  # a step samples at most the 16 train prompts there are
    many_prompts["domains"][0]["prompts"]["n_train"] = 10**9
    [est] = estimate_steps(CascadeConfig.model_validate(many_prompts), shape)
    assert est.field == "stages.0.grpo.prompts_per_step" and est.bytes > 1000 * GIB
    small, large = (
        estimate_steps(CascadeConfig.model_validate(data(random_tiny_model, tmp_path, group_size=g)), shape)[
            0
        ].bytes
        for g in (4, 8)
    )
    assert large > small  # more sequences, more memory


def test_memory_gib_overrides_the_machine(random_tiny_model: Path, tmp_path: Path) -> None:
    big = data(random_tiny_model, tmp_path, group_size=200_000)
    need = estimate_steps(CascadeConfig.model_validate(big), ModelShape.read(random_tiny_model))[0].bytes  # type: ignore[arg-type]
    assert (
        step_memory_problems(CascadeConfig.model_validate({**big, "learner": {"memory_gib": 2 * need / GIB}}))
        == []
    )
    [problem] = step_memory_problems(
        CascadeConfig.model_validate({**big, "learner": {"memory_gib": need / GIB / 2}})
    )
    assert "of learner.memory_gib" in problem
    assert step_memory_problems(CascadeConfig.model_validate(big), ranks=10**6) == []  # shared by many ranks


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
        assert "stages.0.grpo.group_size: a step of stage 0 needs at least" in done.stderr
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

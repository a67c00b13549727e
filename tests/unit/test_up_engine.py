"""`cascade up --engine vllm`: the flags, the rollout service's command line and environment,
the launch entries for the resume command, and the refusal of a missing vLLM environment.

The real stack on vLLM is tests/e2e/test_distributed_vllm.py; these need no vLLM.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from cascade.cli.engine import engine_launch, vllm_settings
from cascade.cli.main import build_parser, main
from cascade.config import VllmEngineConfig
from cascade.engine import vllm_env
from cascade.up.stack import LocalStack


def _stack(tmp_path: Path, model: Path, **kwargs: object) -> LocalStack:
    return LocalStack(
        config=tmp_path / "c.yaml", model=model, run_dir=tmp_path / "run", log_dir=tmp_path, **kwargs
    )


def _up_args(*flags: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["up", "x.yaml", *flags])


def test_vllm_rollout_service_runs_in_the_vllm_python_with_flags_the_service_accepts(
    tmp_path: Path, random_tiny_model: Path
) -> None:
    from services.rollout.main import parse_args

    settings = VllmEngineConfig(kv_cache_gib=0.5, enforce_eager=False, max_model_len=128, dtype="bfloat16")
    python = str(tmp_path / "venv" / "bin" / "python")
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    stack = _stack(tmp_path, random_tiny_model, engine="vllm", vllm=settings, vllm_python=python)
    proc = stack.rollout_service(1)
    assert proc.name == "rollout-1" and proc.argv[:3] == [python, "-m", "services.rollout.main"]
    served = parse_args(proc.argv[3:])  # what the service makes of them (its own checks included)
    assert served.engine == "vllm" and served.model == random_tiny_model
    assert served.vllm_settings == settings.model_copy(update={"seed": 0})
    assert served.port == proc.port and served.metrics_port == proc.metrics_port
    assert proc.env_extra == {**vllm_env.ENGINE_ENV, "VIRTUAL_ENV": str(tmp_path / "venv")}
    assert proc.start_timeout_s == vllm_env.START_TIMEOUT_S

    hf = _stack(tmp_path, random_tiny_model).rollout_service(0)
    assert hf.argv[0] == sys.executable and "--engine" not in hf.argv
    assert hf.env_extra == {} and hf.start_timeout_s is None
    default = parse_args(_stack(tmp_path, random_tiny_model, engine="vllm").rollout_service(0).argv[3:])
    assert default.vllm_settings == VllmEngineConfig()  # the platform decides eager and KV cache


def test_up_flags_become_the_engine_settings(random_tiny_model: Path) -> None:
    args = _up_args("--engine", "vllm", "--vllm-kv-cache-gib", "2", "--no-vllm-enforce-eager")
    args2 = _up_args("--engine", "vllm", "--vllm-max-model-len", "64", "--vllm-dtype", "bfloat16")
    assert vllm_settings(args, random_tiny_model) == VllmEngineConfig(kv_cache_gib=2, enforce_eager=False)
    assert vllm_settings(args2, random_tiny_model) == VllmEngineConfig(max_model_len=64, dtype="bfloat16")
    assert _up_args().engine == "hf"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--vllm-kv-cache-gib", "0"], "--vllm-kv-cache-gib: Input should be greater than 0"),
        (["--vllm-gpu-memory-utilization", "1.5"], "--vllm-gpu-memory-utilization: Input should be less"),
        (["--vllm-max-model-len", "100000"], "--vllm-max-model-len: 100000 is over the model's"),
        (["--vllm-tensor-parallel-size", "3"], "--vllm-tensor-parallel-size: 3 does not divide"),
    ],
)
def test_a_bad_engine_setting_is_refused_naming_its_flag(
    random_tiny_model: Path, flags: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message):
        vllm_settings(_up_args("--engine", "vllm", *flags), random_tiny_model)


def test_engine_launch_names_the_flags_that_were_set() -> None:
    assert engine_launch("hf", VllmEngineConfig(), None) == {"engine": "hf"}
    assert engine_launch("vllm", VllmEngineConfig(), None) == {"engine": "vllm"}
    settings = VllmEngineConfig(kv_cache_gib=0.5, enforce_eager=False, max_model_len=96)
    assert engine_launch("vllm", settings, "/v/bin/python") == {
        "engine": "vllm",
        "vllm_python": "/v/bin/python",
        "no_vllm_enforce_eager": True,
        "vllm_kv_cache_gib": 0.5,
        "vllm_max_model_len": 96,
    }
    launch = engine_launch("vllm", VllmEngineConfig(enforce_eager=True, dtype="float32"), None)
    assert launch == {"engine": "vllm", "vllm_dtype": "float32", "vllm_enforce_eager": True}


def test_a_missing_vllm_environment_is_named_with_its_fix(tmp_path: Path) -> None:
    with pytest.raises(vllm_env.VllmEnvironmentError, match="does not exist .*make vllm-env"):
        vllm_env.check_python(tmp_path / "nowhere" / "python")
    with pytest.raises(vllm_env.VllmEnvironmentError, match="has no `vllm` package .*make vllm-env"):
        vllm_env.check_python(sys.executable)  # the main environment has no vLLM


def test_cascade_up_without_the_vllm_environment_starts_nothing(
    tmp_path: Path, random_tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    domain = {"name": "math", "prompts": {"kind": "synthetic", "n_train": 8, "n_eval": 4}}
    data = {
        "name": "x",
        "model": {"path": str(random_tiny_model)},
        "domains": [domain],
        "stages": [{"domain": "math"}],
        "output_dir": str(tmp_path / "runs"),
    }
    config.write_text(yaml.safe_dump(data))
    missing = tmp_path / "no-venv" / "bin" / "python"
    code = main(["up", str(config), "--engine", "vllm", "--vllm-python", str(missing)])
    err = capsys.readouterr().err
    assert code == 1 and f"{missing} does not exist" in err and "make vllm-env" in err, err
    assert not (tmp_path / "runs" / "x-distributed-logs").exists()  # no process started, no log


def test_the_resume_command_restarts_the_same_engine(tmp_path: Path, random_tiny_model: Path) -> None:
    import shlex

    from cascade.runner.record import RunRecord, resume_command

    args = _up_args("--engine", "vllm", "--vllm-kv-cache-gib", "0.5", "--no-vllm-enforce-eager")
    settings = vllm_settings(args, random_tiny_model)
    record = RunRecord(
        config={},
        distill=True,
        kind="distributed",
        db_url=f"sqlite:///{(tmp_path / 'cascade.db').resolve()}",
        cascade_id=1,
        launch=engine_launch("vllm", settings, "/v/bin/python"),
    )
    words = shlex.split(resume_command("x.yaml", tmp_path, record, embedded=False))
    again = build_parser().parse_args(words[1:])
    assert again.resume and again.engine == "vllm" and again.vllm_python == "/v/bin/python"
    assert vllm_settings(again, random_tiny_model) == settings

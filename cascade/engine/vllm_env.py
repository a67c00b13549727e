"""Where the vLLM rollout service runs from, and what its process needs, for launchers.

vLLM pins its own dependency set, so it lives in its own environment (`.venv-vllm`, made by
`make vllm-env`), as the rollout service's container will; everything else runs in the main one.
A launcher (`cascade up --engine vllm`, the real-vLLM tests) starts the rollout service with this
environment's Python, the flags of its `VllmEngineConfig` and `ENGINE_ENV`. Nothing here imports
vLLM.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cascade.config import VllmEngineConfig

REPO = Path(__file__).resolve().parents[2]
VENV_VAR = "CASCADE_VLLM_VENV"
"""Environment variable naming the vLLM environment's directory (default: the repo's `.venv-vllm`)."""

ENGINE_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # share the cores; never pin to ones others use
    "OMP_NUM_THREADS": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}
"""The engine process's variables: on the CPU build, no thread binding and one OpenMP thread
(cores shared with the other processes of the host); no usage reports and no hub lookups anywhere."""

START_TIMEOUT_S = 600.0
"""An engine start: 20-45 s on an idle 2-core machine, several times that with the cores shared
(the HF engine's service is up in seconds)."""


def default_venv() -> Path:
    return Path(os.environ.get(VENV_VAR, REPO / ".venv-vllm"))


def default_python() -> Path:
    return default_venv() / "bin" / "python"


class VllmEnvironmentError(RuntimeError):
    """The Python given for the vLLM rollout service cannot run it (the message says the fix)."""


def check_python(python: str | Path) -> None:
    """Raise `VllmEnvironmentError` unless `python` exists and can import vLLM (looked up, not
    imported: a second at most)."""
    path = Path(python)
    fix = f"build it with `make vllm-env`, or name another with --vllm-python or {VENV_VAR}"
    if not path.is_file():
        raise VllmEnvironmentError(f"no vLLM environment: {path} does not exist ({fix})")
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        done = subprocess.run([str(path), "-c", probe], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise VllmEnvironmentError(f"{path} does not run ({err}; {fix})") from err
    if done.returncode != 0:
        raise VllmEnvironmentError(f"{path} has no `vllm` package ({fix})")


def process_env(python: str | Path) -> dict[str, str]:
    """What the engine process adds to its launcher's environment: `ENGINE_ENV`, and VIRTUAL_ENV
    pointing at the vLLM environment (not the launcher's)."""
    env = dict(ENGINE_ENV)
    venv = Path(python).parent.parent
    if (venv / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(venv)
    return env


def service_flags(settings: VllmEngineConfig) -> list[str]:
    """`cascade-rollout --engine vllm` flags for `settings` (defaults left to the service)."""
    flags = ["--engine", "vllm"]
    if settings.dtype != "auto":
        flags += ["--dtype", settings.dtype]
    if settings.enforce_eager is not None:
        flags.append("--enforce-eager" if settings.enforce_eager else "--no-enforce-eager")
    if settings.kv_cache_gib is not None:
        flags += ["--kv-cache-gib", f"{settings.kv_cache_gib:g}"]
    if settings.max_model_len is not None:
        flags += ["--max-model-len", str(settings.max_model_len)]
    defaults = VllmEngineConfig()
    if settings.gpu_memory_utilization != defaults.gpu_memory_utilization:
        flags += ["--gpu-memory-utilization", f"{settings.gpu_memory_utilization:g}"]
    if settings.tensor_parallel_size != defaults.tensor_parallel_size:
        flags += ["--tensor-parallel-size", str(settings.tensor_parallel_size)]
    return flags

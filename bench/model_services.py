"""Shared by bench/rollout.py and bench/teacher.py: a model service as a subprocess on free
ports (stopped by its process group), and tiny model directories of chosen sizes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cascade.transport.health import wait_until_serving

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def service(module: str, log: Path, *flags: str, torch_threads: int = 1) -> Iterator[str]:
    """Start `python -m module` and yield its gRPC address once health says SERVING."""
    port = free_port()
    argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--metrics-port", str(free_port()), "--torch-threads", str(torch_threads), *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(torch_threads)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    address = f"127.0.0.1:{port}"
    try:
        why = wait_until_serving(address, timeout_s=120, alive=lambda: proc.poll() is None)
        if why is not None:
            raise RuntimeError(f"{module} {why} before serving:\n{log.read_text()[-3000:]}")
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def random_model(
    out: Path, *, hidden: int = 128, layers: int = 4, seed: int = 0, base: Path | None = None
) -> Path:
    """A random Qwen3 model directory of the given width and depth, sharing the tiny model's
    tokenizer (built once into `base` if not given)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from cascade.bootstrap.policy import TinyModelSpec, save_untrained_model

    base = base or out.parent / "base-tiny"
    if not (base / "config.json").exists():
        save_untrained_model(base, TinyModelSpec(seed=0))
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    config = json.loads((base / "config.json").read_text())
    config.update(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=3 * hidden,
        layer_types=["full_attention"] * layers,
    )
    (out / "config.json").write_text(json.dumps(config))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out))
    model.save_pretrained(out, safe_serialization=True)
    return out


def checkpoint_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))

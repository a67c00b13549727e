"""The rollout and teacher services as real subprocesses on free ports (see `reward_procs.Proc`:
own session, stopped by pid with SIGTERM then SIGKILL to the group, never by name)."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import grpc
from reward_procs import Proc, free_port

from cascade.transport.health import wait_until_serving


class Service:
    def __init__(self, module: str, name: str, log_dir: Path, *flags: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--metrics-port", str(self.metrics_port), "--torch-threads", "1", *flags]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = Proc(name, argv, env, log_dir)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def wait_serving(self, timeout_s: float) -> None:
        alive = lambda: self.proc.popen.poll() is None  # noqa: E731
        why = wait_until_serving(f"127.0.0.1:{self.port}", timeout_s=timeout_s, alive=alive)
        if why == "exited":
            raise RuntimeError(f"{self.proc.name} exited:\n{self.proc.log()[-3000:]}")
        if why == "timeout":
            raise TimeoutError(
                f"{self.proc.name} not serving within {timeout_s}s:\n{self.proc.log()[-3000:]}"
            )

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def http_health(self) -> tuple[int, bytes]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=5) as r:
            return r.status, r.read().strip()

    def stop(self) -> None:
        self.channel.close()
        self.proc.stop()

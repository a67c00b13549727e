"""The rollout and teacher services as real subprocesses on free ports (see `reward_procs.Proc`:
own session, stopped by pid with SIGTERM then SIGKILL to the group, never by name)."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from reward_procs import Proc, free_port


class Service:
    def __init__(self, module: str, name: str, log_dir: Path, *flags: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--metrics-port", str(self.metrics_port), "--torch-threads", "1", *flags]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = Proc(name, argv, env, log_dir)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def wait_serving(self, timeout_s: float) -> None:
        stub = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(f"{self.proc.name} exited:\n{self.proc.log()[-3000:]}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.proc.name} not serving within {timeout_s}s:\n{self.proc.log()[-3000:]}"
                )
            time.sleep(0.1)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def http_health(self) -> tuple[int, bytes]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=5) as r:
            return r.status, r.read().strip()

    def stop(self) -> None:
        self.channel.close()
        self.proc.stop()

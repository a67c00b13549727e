"""Subprocesses for the reward-service tests: Celery workers and gRPC fronts on free ports.

Each process is started in its own session (so its pid is its process group) and stopped by
that pid, never by name: SIGTERM to the group, then SIGKILL if it lingers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from cascade.transport.health import wait_until_serving

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {text!r} within {timeout_s}s:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the whole process group now (a worker dying mid-task)."""
        self._signal_group(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=8)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # stragglers of the group, if any
        if self.popen.poll() is None:
            self.popen.wait(timeout=10)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass


def service_env(broker_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_REWARD_")}
    env.update({"CASCADE_REWARD_BROKER_URL": broker_url, "PYTHONUNBUFFERED": "1", **extra})
    return env


def start_worker(
    name: str, broker_url: str, log_dir: Path, *, concurrency: int = 1, visibility_timeout_s: float = 60
) -> Proc:
    env = service_env(
        broker_url,
        CASCADE_REWARD_VISIBILITY_TIMEOUT_S=str(visibility_timeout_s),
        CASCADE_REWARD_RESTORE_INTERVAL_S="0.5",
    )
    argv = [sys.executable, "-m", "celery", "-A", "services.reward.tasks", "worker", "--loglevel", "INFO"]
    argv += ["--concurrency", str(concurrency), "--hostname", f"{name}@%h"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return Proc(name, argv, env, log_dir)


class Front:
    """A gRPC front (`python -m services.reward.main`) on free ports."""

    def __init__(self, name: str, broker_url: str, log_dir: Path, *flags: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        argv = [sys.executable, "-m", "services.reward.main", "--host", "127.0.0.1"]
        argv += [
            "--port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            "--broker-url",
            broker_url,
        ]
        self.proc = Proc(name, [*argv, *flags], service_env(broker_url), log_dir)
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

    def stop(self) -> None:
        self.channel.close()
        self.proc.stop()


def start_redis(port: int, log_dir: Path, name: str = "redis") -> Proc:
    """A private, diskless redis-server (for outage tests: the shared one must stay up)."""
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = Proc(name, argv, dict(os.environ), log_dir)
    proc.wait_for_log("Ready to accept connections", 10)
    return proc


REDIS = os.environ.get("CASCADE_TEST_REDIS", "127.0.0.1:6379")
"""The local Redis the reward-service tests use as broker (host:port)."""


def redis_client(db: int) -> Any:
    import redis

    host, port = REDIS.split(":")
    return redis.Redis(host=host, port=int(port), db=db, socket_connect_timeout=3)


def flush_or_skip(*dbs: int) -> None:
    """Empty the broker dbs a test uses; skip if Redis is down (fail under CASCADE_REQUIRE_REDIS=1)."""
    try:
        for db in dbs:
            redis_client(db).flushdb()
    except Exception as err:
        if os.environ.get("CASCADE_REQUIRE_REDIS") == "1":
            pytest.fail(f"Redis unreachable at {REDIS}: {err}")
        pytest.skip(f"Redis unreachable at {REDIS}: {err}")

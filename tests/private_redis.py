"""A private redis-server on a free loopback port, without persistence (`--save "" --appendonly
no`): restarting it loses every key, as a Redis without persistence does. Started and stopped by
pid (never by name); `restart` stops it, waits, and starts it again on the same port."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from cascade.up.stack import free_port


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed")
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"]
        log = (self.workdir / "redis.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on {self.port} did not start") from None
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # no shutdown save: what a crash or a pod restart does
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, down_s: float = 1.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()
        self.restarts += 1

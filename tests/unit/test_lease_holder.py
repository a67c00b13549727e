"""Which lease holder is dead: expired, or a process of this host *and PID namespace* that is
gone. Containers on host networking share the hostname, each in its own PID namespace: a pid
missing here says nothing about a runner in another container."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta

from cascade.store.leases import Holder, holder_is_dead, this_host
from cascade.store.models import RunLease, utcnow


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lease(host: str, pid: int, expires_in_s: float) -> RunLease:
    now = utcnow()
    return RunLease(
        cascade_id=1, token="t", host=host, pid=pid, acquired_at=now, heartbeat_at=now,
        expires_at=now + timedelta(seconds=expires_in_s),
    )  # fmt: skip


def test_this_host_names_the_pid_namespace() -> None:
    host = this_host()
    assert host.startswith(socket.gethostname())
    assert host.endswith(os.readlink("/proc/self/ns/pid"))
    assert Holder.this_process("x").host == host


def test_a_gone_pid_of_this_namespace_is_dead_before_expiry() -> None:
    now = utcnow()
    assert holder_is_dead(_lease(this_host(), _gone_pid(), 30), now)
    assert not holder_is_dead(_lease(this_host(), os.getpid(), 30), now)


def test_a_pid_of_another_namespace_on_this_hostname_is_alive_until_expiry() -> None:
    now = utcnow()
    other_container = f"{socket.gethostname()} pid:[1]"
    assert not holder_is_dead(_lease(other_container, _gone_pid(), 30), now)
    assert not holder_is_dead(_lease(socket.gethostname(), _gone_pid(), 30), now)  # no namespace known
    assert holder_is_dead(_lease(other_container, _gone_pid(), -1), now)

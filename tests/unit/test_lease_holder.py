"""Which lease holder is dead. In this host's PID namespace: exactly when its process is gone,
stopped, or the pid now names another process, whatever the lease's times say. Elsewhere: when
its lease expired by the database's clock. Containers on host networking share the hostname,
each in its own PID namespace: a pid missing here says nothing about a runner in another
container."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

from cascade.store.leases import Holder, holder_is_dead, process_start, this_host
from cascade.store.models import RunLease, utcnow


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lease(host: str, pid: int, expires_in_s: float, pid_start: int | None = None) -> RunLease:
    now = utcnow()
    return RunLease(
        cascade_id=1, token="t", host=host, pid=pid, pid_start=pid_start, acquired_at=now, heartbeat_at=now,
        expires_at=now + timedelta(seconds=expires_in_s), epoch=1,
    )  # fmt: skip


def test_this_host_names_the_pid_namespace() -> None:
    host = this_host()
    assert host.startswith(socket.gethostname())
    assert host.endswith(os.readlink("/proc/self/ns/pid"))
    holder = Holder.this_process("x")
    assert holder.host == host
    assert holder.pid_start == process_start(os.getpid()) and holder.pid_start is not None


def test_a_gone_pid_of_this_namespace_is_dead_before_expiry() -> None:
    now = utcnow()
    assert holder_is_dead(_lease(this_host(), _gone_pid(), 30), now)
    assert not holder_is_dead(_lease(this_host(), os.getpid(), 30), now)


def test_a_running_pid_of_this_namespace_is_alive_after_expiry() -> None:
    """Its heartbeat may be failing (a database it cannot reach, a clock far behind): it is
    still no corpse, and taking its lease over would start a second learner beside it."""
    now = utcnow()
    me = process_start(os.getpid())
    assert not holder_is_dead(_lease(this_host(), os.getpid(), -600, pid_start=me), now)


def test_a_reused_pid_is_not_the_holder() -> None:
    now = utcnow()
    me = process_start(os.getpid())
    assert me is not None
    assert holder_is_dead(_lease(this_host(), os.getpid(), 30, pid_start=me - 1), now)


def test_a_stopped_holder_is_dead() -> None:
    """SIGSTOPped (frozen): it renews nothing, and the fence refuses its writes once taken over."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = process_start(proc.pid)
        assert not holder_is_dead(_lease(this_host(), proc.pid, -1, pid_start=started), utcnow())
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not holder_is_dead(_lease(this_host(), proc.pid, -1, pid_start=started), utcnow()):
            assert time.monotonic() < deadline, "a stopped process still counts as a live holder"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_of_another_namespace_on_this_hostname_is_alive_until_expiry() -> None:
    now = utcnow()
    other_container = f"{socket.gethostname()} pid:[1]"
    assert not holder_is_dead(_lease(other_container, _gone_pid(), 30), now)
    assert not holder_is_dead(_lease(socket.gethostname(), _gone_pid(), 30), now)  # no namespace known
    assert holder_is_dead(_lease(other_container, _gone_pid(), -1), now)

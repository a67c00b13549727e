"""What the bubblewrap sandbox needs from its host, checked at start-up with a clear answer.

`check()` returns one line per requirement; `require()` raises `SandboxUnavailable` listing
what failed. The reward service calls `require()` before it serves; `cascade sandbox check`
prints the report.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cascade.sandbox import cgroups, syscall_filter
from cascade.sandbox.pool import BwrapSettings, SandboxPool, SandboxUnavailable

__all__ = ["KUBERNETES_NEEDS", "Check", "SandboxUnavailable", "check", "format_report", "require"]

KUBERNETES_NEEDS = """\
In a container or Kubernetes pod the sandbox needs:
  - the `bubblewrap` package in the image (Debian/Ubuntu: apt-get install bubblewrap);
  - unprivileged user namespaces: user.max_user_namespaces > 0 on the node (and on Ubuntu
    24.04+, kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile allowing it);
  - securityContext.seccompProfile: Unconfined (or a profile allowing unshare, clone with
    namespace flags, mount and pivot_root): the runtime's default profile blocks them;
  - securityContext.appArmorProfile: Unconfined where AppArmor is on;
  - securityContext.procMount: Unmasked (bwrap mounts a fresh /proc; a masked one refuses);
  - no privileged mode and no added capabilities: run the pod as a non-root uid, which is then
    the sandbox uid;
  - an x86_64 or aarch64 kernel with seccomp filters (CONFIG_SECCOMP_FILTER): every program
    runs under the sandbox's own filter, stacked on the pod's;
  - IPC sysctls that the root of a new IPC namespace may write (kernel.shmmax and co., per
    namespace on recent kernels): each execution caps its own System V IPC;
  - optional but strongly advised: a writable (delegated) cgroup subtree with the memory, pids
    and cpu controllers, for per-execution memory and process caps and a per-worker CPU quota;
    without it memory is capped per process (RLIMIT_AS) only, and a program's CPU hogs can
    make the program on the other worker time out."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def check(settings: BwrapSettings | None = None) -> list[Check]:
    settings = settings or BwrapSettings()
    checks: list[Check] = []
    binary = shutil.which(settings.bwrap)
    version = ""
    if binary:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        version = done.stdout.strip()
    checks.append(Check("bubblewrap", binary is not None, version or f"{settings.bwrap!r} not on PATH"))
    userns = _read_int("/proc/sys/user/max_user_namespaces")
    checks.append(Check("user namespaces", userns != 0, f"user.max_user_namespaces = {userns}"))
    uid = settings.uid if os.geteuid() == 0 else os.geteuid()
    who = "root: drops to" if os.geteuid() == 0 else "not root: runs as its own"
    checks.append(Check("sandbox uid", uid != 0, f"{who} uid {uid}"))
    python = os.path.realpath(settings.python)
    checks.append(Check("sandbox python", os.access(python, os.X_OK), python))
    unsupported = syscall_filter.supported()
    detail = unsupported or f"syscall filter for {platform.machine()}"
    checks.append(Check("seccomp", unsupported is None, detail))
    has_cgroups = settings.use_cgroups and cgroups.available()
    detail = (
        "memory and pids caps per execution" if has_cgroups else "unavailable: RLIMIT_AS per process only"
    )
    checks.append(Check("cgroups", has_cgroups, detail, required=False))
    checks.append(_cpu_check(settings, has_cgroups))
    if all(c.ok for c in checks if c.required):
        checks.append(_start_check(settings))
    return checks


def _cpu_check(settings: BwrapSettings, has_cgroups: bool) -> Check:
    """The per-worker CPU quota: without it one execution's CPU hogs can make another time out."""
    if settings.cpus_per_worker is None:
        return Check("cpu bound", False, "UNBOUNDED: cpus_per_worker is None (" + _HOG_RISK + ")", False)
    if has_cgroups and cgroups.cpu_available():
        detail = f"{settings.cpus_per_worker:g} CPU quota per worker (cgroup cpu controller)"
        return Check("cpu bound", True, detail, required=False)
    return Check("cpu bound", False, "UNBOUNDED: no writable cpu cgroup (" + _HOG_RISK + ")", False)


_HOG_RISK = (
    "a program's busy threads or processes can starve the program on the other worker, which then "
    "times out: one completion can cost another its reward; run as root or delegate a cgroup "
    "subtree with the cpu controller"
)


_PROBE = """
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
confined = status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
def f(x):
    return x + 1 if confined else "the seccomp filter is not active in the sandbox"
"""
"""The start check's program: right only if it runs under the seccomp filter."""


def _start_check(settings: BwrapSettings) -> Check:
    try:
        pool = SandboxPool(1, settings)
    except SandboxUnavailable as err:
        return Check("start a worker", False, str(err))
    try:
        job = {
            "code": _PROBE,
            "tests": [{"input": 1, "output": 2}],
            "entry_point": "f",
        }
        limits = {
            "time_limit_s": 5.0,
            "memory_mb": 256,
            "max_output_bytes": 4096,
            "max_processes": 8,
            "max_file_bytes": 1 << 20,
            "max_open_files": 64,
        }
        result = pool.run([{**job, "limits": limits}])[0]
    finally:
        pool.close()
    ok = result.get("status") == "ok"
    return Check("run a program", ok, "ok" if ok else f"{result.get('status')}: {result.get('detail')}")


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def format_report(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        mark = "ok" if c.ok else ("FAIL" if c.required else "warn")
        lines.append(f"{mark:>4}  {c.name}: {c.detail}")
    return "\n".join(lines)


def require(settings: BwrapSettings | None = None) -> list[Check]:
    """The checks, or `SandboxUnavailable` naming each failed requirement and what a pod needs."""
    checks = check(settings)
    if not all(c.ok for c in checks if c.required):
        raise SandboxUnavailable(
            f"the code sandbox cannot run here:\n{format_report(checks)}\n{KUBERNETES_NEEDS}"
        )
    return checks

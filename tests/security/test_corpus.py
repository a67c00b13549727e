"""The security corpus: hostile programs through the bubblewrap sandbox.

Each program in `corpus/` states its expected verdict (`# expect: <reason>`). For every one:
the verdict is right, nothing of the host leaked into the detail, no host file changed, no
process of the sandbox uid is left besides the warm workers, and the pool still serves.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cascade.sandbox.jobs import Job, SandboxLimits, run_jobs
from cascade.sandbox.pool import BwrapSettings, SandboxPool, SandboxUnavailable

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.py"))
LIMITS = SandboxLimits(time_limit_s=1.0, memory_mb=256, max_output_bytes=4096, max_processes=8)
TESTS = [{"input": 1, "output": 2}, {"input": 5, "output": 6}]
SECRET = "cascade-secret-7f3a9c"
SETTINGS = BwrapSettings()
HOST_FILES = ["/etc/passwd", "/etc/shadow", "/etc/hostname"]
MUST_NOT_EXIST = [
    "/cascade-evil",
    "/usr/lib/cascade-evil",
    "/tmp/rooted",
    "/tmp/daemon-was-here",
    "/usr/evil",
]


def expected_reason(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <reason>'"
    return first.removeprefix("# expect: ").strip()


def _digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "absent"


def sandbox_uid() -> int:
    return SETTINGS.uid if os.geteuid() == 0 else os.geteuid()


def processes_of(uid: int) -> set[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            found.add(int(entry.name))
    return found


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    os.environ["CASCADE_SECRET_TOKEN"] = SECRET
    Path("/tmp/cascade-secret.txt").write_text(SECRET)
    try:
        pool = SandboxPool(2, SETTINGS)
    except SandboxUnavailable as err:
        if shutil.which("bwrap"):  # installed but unusable: a broken sandbox must not pass quietly
            pytest.fail(f"bubblewrap is installed but the sandbox cannot start: {err}")
        pytest.skip(f"bubblewrap sandbox unavailable here: {err}")
    yield pool
    pool.close()
    os.environ.pop("CASCADE_SECRET_TOKEN", None)
    Path("/tmp/cascade-secret.txt").unlink(missing_ok=True)


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 25
    reasons = {expected_reason(p) for p in CORPUS}
    assert {"timeout", "memory_limit", "output_limit", "runtime_error", "ok"} <= reasons


def _run(pool: SandboxPool, code: str) -> dict:
    job = {"code": code, "tests": TESTS, "entry_point": "f", "stop_on_failure": True}
    return pool.run([{**job, "limits": LIMITS.__dict__}])[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("program", CORPUS, ids=[p.stem for p in CORPUS])
def test_hostile_program_is_contained(pool: SandboxPool, program: Path) -> None:
    uid = sandbox_uid()
    workers = processes_of(uid)
    before = {path: _digest(path) for path in HOST_FILES}
    result = _run(pool, program.read_text())
    assert result["status"] == expected_reason(program), result
    assert SECRET not in result.get("detail", "")
    for path in HOST_FILES:
        assert _digest(path) == before[path], f"{path} changed"
    for path in MUST_NOT_EXIST:
        assert not os.path.exists(path), f"{path} was created on the host"
    deadline = time.monotonic() + 5
    while (left := processes_of(uid) - workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(left)}"
    assert _run(pool, "def f(x):\n    return x + 1")["status"] == "ok"  # still serving
    assert pool.workers[0].restarts == pool.workers[1].restarts == 0


def test_nothing_leaks_between_executions(pool: SandboxPool) -> None:
    """Files in /tmp and /dev/shm, SysV shared memory and module state die with an execution."""
    writer = (
        "import ctypes, json, os\n"
        "open('/tmp/left.txt', 'w').write('x')\n"
        "open('/dev/shm/left', 'w').write('x')\n"
        "json.LEFT = 1\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.shmget(0x5EC, 4096, 0o1666) >= 0\n"  # IPC_CREAT
        "def f(x):\n    return x + 1\n"
    )
    reader = (
        "import ctypes, json, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "seen = [os.path.exists('/tmp/left.txt'), os.path.exists('/dev/shm/left'),\n"
        "        hasattr(json, 'LEFT'), libc.shmget(0x5EC, 0, 0) >= 0]\n"
        "def f(x):\n    return x + 1 if not any(seen) else repr(seen)\n"
    )
    for _ in range(3):  # both workers, whichever order
        results = pool.run(
            [
                {"code": c, "tests": TESTS, "entry_point": "f", "limits": LIMITS.__dict__}
                for c in (writer, reader, reader)
            ]
        )
        assert [r["status"] for r in results] == ["ok", "ok", "ok"], results


def test_program_runs_as_unprivileged_uid_without_capabilities(pool: SandboxPool) -> None:
    """Not root (its own user namespace), no capability, no_new_privs, the seccomp filter on,
    and the OOM killer's first choice."""
    code = (
        "import os\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "def f(x):\n"
        "    caps = [status[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd')]\n"
        "    ok = os.getuid() != 0 and set(caps) == {'0000000000000000'}\n"
        "    ok = ok and status['NoNewPrivs'].strip() == '1' and os.listdir('/proc') != []\n"
        "    ok = ok and status['Seccomp'].strip() == '2' and status['CapAmb'].strip() == '0' * 16\n"
        "    ok = ok and open('/proc/self/oom_score_adj').read().strip() == '1000'\n"
        "    return x + 1 if ok else repr((os.getuid(), caps))\n"
    )
    assert _run(pool, code)["status"] == "ok"


def test_run_jobs_bwrap_backend_matches_reasons() -> None:
    try:
        results = run_jobs(
            [Job("def f(x):\n    return x + 1", TESTS, "f"), Job("def f(x):\n    return x", TESTS, "f")],
            LIMITS,
            backend="bwrap",
        )
    except SandboxUnavailable as err:
        pytest.skip(str(err))
    assert [(r.status, r.passed, r.total) for r in results] == [("ok", 2, 2), ("wrong_answer", 0, 2)]


def test_execution_runs_in_its_own_cgroup(pool: SandboxPool) -> None:
    """At its memory cap an execution is OOM-killed in its own group, whatever it sets its
    oom_score_adj to (it may lower it to 0): never the worker or the judge."""
    from cascade.sandbox import cgroups

    if not (SETTINGS.use_cgroups and cgroups.available()) or pool.workers[0].group.v2:  # type: ignore[union-attr]
        pytest.skip("per-execution cgroups need cgroup v1 with write access")
    code = (
        "def f(x):\n    text = open('/proc/self/cgroup').read()\n"
        "    return x + 1 if ':/exec' in text else text\n"
    )
    assert _run(pool, code)["status"] == "ok"

"""One completion must never cost another its reward: CPU hogs beside a correct program.

The pool has two workers. While a hostile program spins on one of them (threads in C code that
run without the GIL, forked children, children that each start a new session, busy
grandchildren that outlive their parent), a correct program that needs ~30% of its wall-clock
budget in CPU runs on the other, several times, and must pass every time; then the roles swap.
Each worker's CPU quota (`cgroups.WorkerGroup.set_cpus`, one CPU by default) is what holds it:
without it the hog's dozen busy tasks take both cores and the neighbour times out.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cascade.sandbox import cgroups
from cascade.sandbox.pool import BwrapSettings, SandboxPool

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
    pytest.mark.timeout(300),
]

BUDGET_S = 2.0
BUSY_S = 0.6
"""CPU seconds the correct program burns: 30% of its budget, alone on a core."""
LIMITS = {
    "time_limit_s": BUDGET_S,
    "memory_mb": 256,
    "max_output_bytes": 4096,
    "max_processes": 16,
    "max_file_bytes": 1 << 20,
    "max_open_files": 64,
}
HOG_LIMITS = {**LIMITS, "time_limit_s": 3.5, "memory_mb": 1024}
"""The hog's budget outlasts the neighbour's runs, so they all run beside it; its memory holds a
malloc arena for each of its threads."""
NEIGHBOUR_RUNS = 2

CORRECT = f"""
import time
def f(x):
    start = time.process_time()
    while time.process_time() - start < {BUSY_S}:
        pass
    return x + 1
"""

HOGS: dict[str, str] = {
    "threads_without_the_gil": """
import hashlib, threading
BLOCK = b"x" * (1 << 20)
def spin():
    while True:
        hashlib.sha256(BLOCK).digest()
def f(x):
    threading.stack_size(1 << 18)
    for _ in range(12):
        try:
            threading.Thread(target=spin, daemon=True).start()
        except RuntimeError:  # as many as its address space holds (each has a malloc arena)
            break
    spin()
""",
    "forked_children": """
import os
def f(x):
    for _ in range(12):
        if os.fork() == 0:
            while True:
                pass
    while True:
        pass
""",
    "children_in_new_sessions": """
import os
def f(x):
    for _ in range(12):
        if os.fork() == 0:
            os.setsid()
            while True:
                pass
    while True:
        pass
""",
    "busy_children_outlive_their_parent": """
import os, time
def f(x):
    if os.fork() == 0:  # a parent that starts busy children in new sessions, then exits
        for _ in range(12):
            if os.fork() == 0:
                os.setsid()
                while True:
                    pass
        os._exit(0)
    time.sleep(60)
""",
}


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    pool = SandboxPool(2, BwrapSettings())
    if not pool.cpu_bounded():
        pool.close()
        reason = "cgroups disabled" if not cgroups.available() else "no writable cpu controller"
        pytest.skip(
            f"the per-worker CPU bound cannot be enforced here ({reason}): see `cascade sandbox check`"
        )
    for worker in pool.workers:
        _weigh_like_a_dedicated_host(worker.group)
    yield pool
    pool.close()


def _weigh_like_a_dedicated_host(group: cgroups.WorkerGroup | None) -> None:
    """Ten times the default CPU weight for the workers' groups, so that other load on a shared
    test machine (each of its busy threads weighs as much as a whole worker) does not decide
    whether the neighbour finishes: the hog's quota does. Both workers get the same weight."""
    assert group is not None and group.cpu_dir is not None
    if group.v2:
        (group.cpu_dir / "cpu.weight").write_text("1000")
    else:
        (group.cpu_dir / "cpu.shares").write_text("10240")


def _job(code: str, limits: dict[str, Any], i: int) -> dict[str, Any]:
    return {"i": i, "code": code, "tests": [{"input": 1, "output": 2}], "entry_point": "f", "limits": limits}


def test_each_worker_is_bounded_to_one_cpu(pool: SandboxPool) -> None:
    assert [w.group.cpu_limit() if w.group else None for w in pool.workers] == [1.0, 1.0]


@pytest.mark.parametrize("hog_worker", [0, 1])
@pytest.mark.parametrize("hog", list(HOGS))
def test_correct_program_keeps_ok_beside_a_cpu_hog(pool: SandboxPool, hog: str, hog_worker: int) -> None:
    hogging, neighbour = pool.workers[hog_worker], pool.workers[1 - hog_worker]
    alone = time.monotonic()
    control = neighbour.execute(_job(CORRECT, LIMITS, 0))
    alone = time.monotonic() - alone
    if control["status"] != "ok" or alone > 0.6 * BUDGET_S:
        # Under half a core even alone: other load on this machine, not the hog, decides.
        pytest.skip(f"machine overloaded: the correct program alone took {alone:.2f}s ({control['status']})")
    hog_result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: hog_result.update(hogging.execute(_job(HOGS[hog], HOG_LIMITS, 1)))
    )
    thread.start()
    time.sleep(0.5)  # the hog is spinning with all its tasks
    results = [neighbour.execute(_job(CORRECT, LIMITS, 2 + n)) for n in range(NEIGHBOUR_RUNS)]
    thread.join()
    assert [r["status"] for r in results] == ["ok"] * NEIGHBOUR_RUNS, results
    assert hog_result["status"] in {"timeout", "runtime_error", "memory_limit"}, hog_result
    assert hog_result["status"] != "ok"
    assert [w.restarts for w in pool.workers] == [0, 0]

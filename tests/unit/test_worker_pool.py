"""WorkerPool: killable worker processes with per-task timeouts, call deadlines and fair shares
between concurrent callers (the math domain's off-thread checks and the reward front's
light-domain scoring run on it)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from cascade.domains.worker_pool import Outcome, WorkerPool

pytestmark = pytest.mark.timeout(120)


def _task(kind: str, seconds: float = 0.0) -> str:
    if kind == "sleep":
        time.sleep(seconds)
    elif kind == "exit":
        os._exit(3)
    elif kind == "raise":
        raise ValueError("bad input")
    return f"{kind} done in {os.getpid()}"


def _run(pool: WorkerPool, tasks: list[tuple[object, ...]], **kw: object) -> list[Outcome]:
    out: list[Outcome | None] = [None] * len(tasks)
    for i, outcome in pool.run(_task, tasks, **kw):  # type: ignore[arg-type]
        assert out[i] is None, "each task is reported once"
        out[i] = outcome
    assert all(o is not None for o in out)
    return [o for o in out if o is not None]


@pytest.fixture
def pool() -> WorkerPool:
    p = WorkerPool(2, name="test-pool")
    yield p
    p.close()


def test_timeouts_and_deaths_cost_only_their_own_task(pool: WorkerPool) -> None:
    tasks: list[tuple[object, ...]] = [("ok",), ("sleep", 60.0), ("exit",), ("raise",), ("ok",)]
    out = _run(pool, tasks, timeout_s=1.5)
    assert [o.kind for o in out] == ["ok", "timeout", "died", "error", "ok"]
    assert "ValueError" in out[3].detail and "exit code 3" in out[2].detail
    assert pool.workers <= 2
    # the killed workers were replaced: the pool still works
    assert [o.kind for o in _run(pool, [("ok",)] * 3, timeout_s=30)] == ["ok"] * 3


def test_a_passed_deadline_stops_the_call_and_frees_its_workers(pool: WorkerPool) -> None:
    start = time.monotonic()
    tasks: list[tuple[object, ...]] = [("ok",), *[("sleep", 60.0)] * 4]
    out = _run(pool, tasks, timeout_s=120, deadline=start + 3.0)
    assert out[0].kind == "ok"
    assert [o.kind for o in out[1:]] == ["expired"] * 4
    assert "deadline" in out[1].detail
    assert time.monotonic() - start < 20  # not the 60 s the tasks wanted
    assert [o.kind for o in _run(pool, [("ok",)], timeout_s=30)] == ["ok"]


def test_a_caller_that_stops_reading_has_its_workers_killed(pool: WorkerPool) -> None:
    stream = pool.run(_task, [("ok",), ("sleep", 60.0), ("sleep", 60.0)], timeout_s=120)
    next(stream)
    stream.close()
    assert pool.workers <= 1  # the sleeping one was killed, not left running
    assert [o.kind for o in _run(pool, [("ok",)] * 2, timeout_s=30)] == ["ok"] * 2


def test_concurrent_callers_share_the_workers() -> None:
    """A caller with many slow tasks does not hold every worker while another waits."""
    pool = WorkerPool(2, name="test-fair")
    pool.start()
    finished: dict[str, float] = {}

    def call(name: str, tasks: list[tuple[object, ...]]) -> None:
        _run(pool, tasks, timeout_s=60)
        finished[name] = time.monotonic()

    try:
        slow = threading.Thread(target=call, args=("slow", [("sleep", 1.5)] * 6))
        slow.start()
        time.sleep(0.5)  # the slow caller holds both workers now
        start = time.monotonic()
        call("fast", [("ok",), ("ok",)])
        slow.join(timeout=60)
        assert finished["fast"] < finished["slow"]
        # FIFO would have made it wait for all six (three rounds of 1.5 s on two workers)
        assert finished["fast"] - start < 3.5
    finally:
        pool.close()

"""Killable worker processes for checks that may not return: each task gets its own timeout,
a call can stop at a deadline, and concurrent callers share the workers fairly.

Why not `ProcessPoolExecutor`: it cannot stop one running task, only the whole pool, so one
runaway check would cost every other caller its in-flight work; and it serves tasks first in,
first out, so one caller with many slow items starves another with a few easy ones.

Here each worker is its own process on a pipe; it runs one task at a time in its main thread
(where SIGALRM deadlines work). A task that overruns its timeout, or is still running when its
call's deadline passes or its caller goes away, has its worker killed; a new one is started
when next needed. Workers are forked from multiprocessing's fork server with `preload`
modules already imported (a new math worker is ready in well under a second instead of the
seconds sympy takes to import), never from the caller's own threaded process.

Concurrent calls each hold at most `size // calls` workers (at least one), so a caller with
two items is served alongside one with two hundred.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal, cast

log = logging.getLogger(__name__)

OutcomeKind = Literal["ok", "error", "timeout", "died", "expired", "cancelled", "unavailable"]

_POLL_S = 0.05
"""How often a caller with items waiting for a worker looks again."""


@dataclass(frozen=True)
class Outcome:
    """What became of one task: `ok` (value is its result), `error` (it raised; detail says
    what), `timeout` (killed after its timeout), `died` (its worker exited), `expired` (the
    call's deadline passed first), `cancelled` (the caller went away first), `unavailable`
    (no worker could be started)."""

    kind: OutcomeKind
    value: Any = None
    detail: str = ""


def default_size(cap: int = 8) -> int:
    """Workers for this host: its usable cores, at most `cap`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cap, cores))


_IN_WORKER = False


def in_worker() -> bool:
    """Whether this process is a pool's worker (its task already runs under a killable timeout)."""
    return _IN_WORKER


def _serve(conn: Connection, initializer: Callable[[], None] | None) -> None:
    """A worker's loop: run `(fn, args)` messages until the pipe closes (the parent is gone)."""
    global _IN_WORKER
    _IN_WORKER = True
    if initializer is not None:
        initializer()
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        fn, args = message
        try:
            reply: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as err:  # noqa: BLE001 - the task's failure is reported, not ours
            reply = ("error", f"{type(err).__name__}: {err!r:.300}")
        try:
            conn.send(reply)
        except Exception as err:  # an unpicklable result
            conn.send(("error", f"result cannot be sent back: {err!r:.300}"))


def _context(preload: Sequence[str]) -> Any:
    """The fork server's context, with `preload` imported there (only the first call's list
    counts: the server starts once per process); `spawn` where there is no fork server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    with _PRELOAD_LOCK:
        _PRELOAD.update(preload)
        context.set_forkserver_preload(sorted(_PRELOAD))
    return context


_PRELOAD: set[str] = set()
_PRELOAD_LOCK = threading.Lock()


class _Worker:
    def __init__(self, context: Any, initializer: Callable[[], None] | None, name: str) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, initializer), name=name, daemon=True)
        self.process.start()
        child.close()

    def wait_ready(self, timeout_s: float) -> None:
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"worker not ready within {timeout_s:g}s")
        self.conn.recv()  # ("ready", None); EOFError if it died starting

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class _Caller:
    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class WorkerPool:
    """Up to `size` worker processes, started on first need (or by `start`)."""

    def __init__(
        self,
        size: int,
        *,
        initializer: Callable[[], None] | None = None,
        start_timeout_s: float = 120.0,
        name: str = "cascade-worker",
        preload: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {size}")
        self.size = size
        self.initializer = initializer
        self.start_timeout_s = start_timeout_s
        self.name = name
        self._context = _context(preload)
        self._idle: list[_Worker] = []
        self._started = 0
        self._callers: set[_Caller] = set()
        self._closed = False
        self._cond = threading.Condition()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start every worker now (a server warms its pool before it says it is serving)."""
        with self._cond:
            n = self.size - self._started
            self._started += n
        workers = [self._spawn() for _ in range(n)]
        started: list[_Worker] = []
        try:
            for worker in workers:
                worker.wait_ready(self.start_timeout_s)
                started.append(worker)
        except BaseException:
            for worker in workers:
                worker.kill()
            with self._cond:
                self._started -= n
            raise
        with self._cond:
            self._idle += started
            self._cond.notify_all()

    def close(self) -> None:
        """Kill the idle workers now and every busy one as its task ends."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._started -= len(idle)
        for worker in idle:
            worker.kill()

    @property
    def workers(self) -> int:
        """Workers alive or starting now."""
        with self._cond:
            return self._started

    # ----------------------------------------------------------------- running

    def run(
        self,
        fn: Callable[..., Any],
        tasks: Sequence[tuple[Any, ...]],
        *,
        timeout_s: float,
        deadline: float | None = None,
        is_active: Callable[[], bool] = lambda: True,
    ) -> Iterator[tuple[int, Outcome]]:
        """`(index, outcome)` of each `fn(*tasks[index])`, in the order they finish.

        `fn` must pickle (a module-level function). Each task may run `timeout_s` seconds.
        `deadline` (a `time.monotonic()` value): tasks not finished by then are `expired`.
        `is_active()` false (the client went away): the rest are `cancelled`. Either way the
        workers still running this call's tasks are killed, so they serve others at once.
        """
        caller = _Caller()
        with self._cond:
            self._callers.add(caller)
        pending = deque(range(len(tasks)))
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        try:
            while pending or busy:
                stop = self._stop_reason(deadline, is_active)
                if stop is not None:
                    for conn in list(busy):
                        worker, i, _ = busy.pop(conn)
                        self._discard(caller, worker)
                        yield i, stop
                    while pending:
                        yield pending.popleft(), stop
                    return
                while pending:
                    try:
                        taken = self._take(caller)
                    except Exception as err:
                        log.error("%s: cannot start a worker: %r", self.name, err)
                        failed = Outcome("unavailable", detail=f"worker failed to start: {err!r:.200}")
                        while pending:
                            yield pending.popleft(), failed
                        break
                    if taken is None:
                        break
                    i = pending.popleft()
                    try:
                        taken.conn.send((fn, tasks[i]))
                    except Exception as err:  # its worker is gone, or the task does not pickle
                        self._discard(caller, taken)
                        yield i, Outcome("error", detail=f"task cannot be sent: {err!r:.200}")
                        continue
                    busy[taken.conn] = (taken, i, time.monotonic() + timeout_s)
                if not busy:
                    if pending:
                        self._wait_for_worker(deadline)
                    continue
                now = time.monotonic()
                until = min(expiry for _, _, expiry in busy.values())
                if deadline is not None:
                    until = min(until, deadline)
                wait_s = max(0.0, until - now)
                if pending:
                    wait_s = min(wait_s, _POLL_S)
                for ready in wait(list(busy), timeout=min(wait_s, 1.0)):
                    conn = cast(Connection, ready)
                    worker, i, _ = busy.pop(conn)
                    try:
                        kind, value = conn.recv()
                    except (EOFError, OSError):
                        worker.process.join(timeout=1)
                        code = worker.process.exitcode
                        self._discard(caller, worker)
                        yield i, Outcome("died", detail=f"worker process died (exit code {code})")
                        continue
                    self._give_back(caller, worker)
                    yield i, Outcome("ok", value) if kind == "ok" else Outcome("error", detail=str(value))
                now = time.monotonic()
                for conn, (worker, i, expiry) in list(busy.items()):
                    if now >= expiry:
                        del busy[conn]
                        self._discard(caller, worker)
                        yield i, Outcome("timeout", detail=f"over {timeout_s:g}s (worker killed)")
        finally:
            for worker, _, _ in busy.values():  # the caller stopped reading: nobody wants these
                self._discard(caller, worker)
            with self._cond:
                self._callers.discard(caller)
                self._cond.notify_all()

    @staticmethod
    def _stop_reason(deadline: float | None, is_active: Callable[[], bool]) -> Outcome | None:
        if deadline is not None and time.monotonic() >= deadline:
            return Outcome("expired", detail="the request's deadline passed before this item was scored")
        if not is_active():
            return Outcome("cancelled", detail="the client went away")
        return None

    def _take(self, caller: _Caller) -> _Worker | None:
        """An idle worker (or a new one) if `caller` is within its share, else None."""
        with self._cond:
            if self._closed:
                raise RuntimeError("worker pool is closed")
            share = max(1, self.size // max(1, len(self._callers)))
            if caller.held >= share:
                return None
            if self._idle:
                caller.held += 1
                return self._idle.pop()
            if self._started >= self.size:
                return None
            self._started += 1
            caller.held += 1
        try:
            worker = self._spawn()
            try:
                worker.wait_ready(self.start_timeout_s)
            except BaseException:
                worker.kill()
                raise
        except BaseException:
            with self._cond:
                self._started -= 1
                caller.held -= 1
                self._cond.notify_all()
            raise
        return worker

    def _spawn(self) -> _Worker:
        return _Worker(self._context, self.initializer, self.name)

    def _wait_for_worker(self, deadline: float | None) -> None:
        timeout = _POLL_S * 4 if deadline is None else max(0.0, min(_POLL_S * 4, deadline - time.monotonic()))
        with self._cond:
            self._cond.wait(timeout)

    def _give_back(self, caller: _Caller, worker: _Worker) -> None:
        with self._cond:
            caller.held -= 1
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify_all()
                return
            self._started -= 1
        worker.kill()

    def _discard(self, caller: _Caller, worker: _Worker) -> None:
        worker.kill()
        with self._cond:
            caller.held -= 1
            self._started -= 1
            self._cond.notify_all()

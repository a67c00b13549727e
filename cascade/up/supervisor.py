"""`cascade up` keeps running what it started.

A process of the stack that died (a rollout replica, the reward front, a Celery worker, the
teacher service, a rollout worker) is reported (name, pid, exit code or signal, the end of its
log) and started again with the same arguments, so on the same port. The first restart is
immediate, each further one within the window waits twice as long (1 s, 2 s, 4 s, ... at most
`max_delay_s`), so a process that cannot start does not spin. Past `max_restarts` restarts of one
process within `window_s`, the supervisor gives up (`GaveUp`): `cascade up` stops the stack with
that reason and the resume command.

The learner is not supervised: its death ends `cascade up`, since only `--resume` restarts it
without losing anything (from its last checkpoint).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class RestartBound:
    max_restarts: int = 5
    """Restarts of one process allowed within `window_s`; one more death and the stack stops."""
    window_s: float = 600.0
    max_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be at least 0, got {self.max_restarts}")
        if self.window_s <= 0:
            raise ValueError(f"--restart-window-s must be positive, got {self.window_s:g}")

    def delay_s(self, recent: int) -> float:
        """Wait before a restart when `recent` restarts of the process lie within the window."""
        return 0.0 if recent == 0 else min(self.max_delay_s, 2.0 ** (recent - 1))


class Supervised(Protocol):
    name: str
    log_path: Path

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def exit_status(self) -> str: ...

    def log_tail(self, lines: int = 20) -> str: ...


class GaveUp(RuntimeError):
    """A process died more often than its restart bound allows."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(reason)
        self.name = name


@dataclass
class _Watch:
    restarts: deque[float] = field(default_factory=deque)
    """When the process was restarted, within the window."""
    due: float | None = None
    """When to start it again (it is dead and was reported)."""


def death_report(proc: Supervised, lines: int = 20) -> str:
    tail = proc.log_tail(lines).rstrip("\n")
    shown = "\n".join(f"    | {line}" for line in tail.splitlines()) if tail else "    (nothing logged)"
    return f"{proc.name} (pid {proc.pid}) died: {proc.exit_status()}; its log {proc.log_path} ends:\n{shown}"


class Supervisor:
    def __init__(
        self,
        bound: RestartBound,
        *,
        restart: Callable[[Supervised], None],
        report: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bound, self._restart, self.report, self._clock = bound, restart, report, clock
        self._watch: dict[str, _Watch] = {}
        self.restarts: Counter[str] = Counter()
        """Restarts per process name since the supervisor began."""

    def check(self, procs: Iterable[Supervised]) -> None:
        """One look at every process: report the newly dead, restart those whose wait is over.
        Raises `GaveUp` when a process died past its bound."""
        now = self._clock()
        for proc in procs:
            watch = self._watch.setdefault(proc.name, _Watch())
            if watch.due is not None:
                if now >= watch.due:
                    self._start_again(proc, watch, now)
                continue
            if proc.alive():
                continue
            self.report(death_report(proc))
            while watch.restarts and now - watch.restarts[0] > self.bound.window_s:
                watch.restarts.popleft()
            recent = len(watch.restarts)
            if recent >= self.bound.max_restarts:
                raise GaveUp(
                    proc.name,
                    f"{proc.name} died again after {recent} restart(s) within {self.bound.window_s:g}s "
                    f"(bound: --max-restarts {self.bound.max_restarts} per --restart-window-s "
                    f"{self.bound.window_s:g}); last: {proc.exit_status()}",
                )
            watch.due = now + self.bound.delay_s(recent)
            if watch.due > now:
                self.report(f"{proc.name}: restarting in {watch.due - now:.0f}s")
            else:
                self._start_again(proc, watch, now)

    def _start_again(self, proc: Supervised, watch: _Watch, now: float) -> None:
        watch.due = None
        watch.restarts.append(now)
        self.restarts[proc.name] += 1
        self._restart(proc)
        self.report(
            f"restarted {proc.name} (pid {proc.pid}) with the same arguments "
            f"(restart {len(watch.restarts)} of at most {self.bound.max_restarts} within "
            f"{self.bound.window_s:g}s)"
        )

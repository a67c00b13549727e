"""Bounded retries for the dependencies a long run talks to (database, Redis, teacher, rollout).

One `Dependency` per thing that can blip. Its `call` retries a failing operation with capped
exponential backoff while the *outage* (not the single call) is younger than `give_up_after_s`;
an outage spans every call that fails until one succeeds, so a loop making many calls into a
dead database gives up once, after the bound, not after bound x calls. The first failure of an
outage is logged once with its cause, the recovery once with its length; outages and seconds
down are counted for the step metrics and Prometheus, and `degraded` says whether one is open
now (the API shows it). Past the bound `DependencyDown` is raised, naming the dependency, the
cause and how long it was down: the caller stops the run with that reason and its resume command.

Only errors the caller names as transient are retried: a retry of a programming error or of a
refused request would only hide it. Operations must be idempotent (a step row written twice
must not duplicate), since a call that failed on the way back may have taken effect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def describe(err: BaseException) -> str:
    """`Type: first line of the message`, at most 300 characters (a driver's error can carry its
    SQL and a help link on further lines: one outage, one log line)."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 300 else text[:297] + "..."


class DependencyDown(RuntimeError):
    """A dependency stayed unreachable past its bound."""

    def __init__(self, name: str, cause: BaseException, down_s: float) -> None:
        super().__init__(f"{name} unreachable for {down_s:.0f}s (bound reached): {describe(cause)}")
        self.name, self.cause, self.down_s = name, cause, down_s


@dataclass
class OutageStats:
    outages: int = 0
    """Outages begun (each counted once, however many calls failed in it)."""
    retries: int = 0
    """Failed calls that were retried."""
    down_s: float = 0.0
    """Seconds spent in outages that have ended."""


class Dependency:
    def __init__(
        self,
        name: str,
        *,
        give_up_after_s: float,
        transient: tuple[type[BaseException], ...],
        log: Callable[[str], None],
        retry_if: Callable[[BaseException], bool] | None = None,
        first_delay_s: float = 0.2,
        max_delay_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if give_up_after_s < 0:
            raise ValueError(f"{name}: give_up_after_s must be >= 0, got {give_up_after_s}")
        self.name, self.give_up_after_s, self.transient = name, give_up_after_s, transient
        self.retry_if = retry_if
        """Narrows `transient`: an error of those types that this says no to is raised at once
        (e.g. a SQLAlchemy `OperationalError` that is a missing table, not a dropped connection)."""
        self.log, self.first_delay_s, self.max_delay_s = log, first_delay_s, max_delay_s
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._attempt = 0
        self.stats = OutageStats()
        self.cause: str | None = None
        """The first error of the open outage, else of the last one (`Type: message`)."""

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    def down_for_s(self) -> float:
        since = self._down_since
        return 0.0 if since is None else self._clock() - since

    def failed(self, err: BaseException) -> float:
        """Record one failed call; the seconds to wait before the next try. Raises past the bound."""
        with self._lock:
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
                self._attempt = 0
                self.stats.outages += 1
                self.cause = describe(err)
                self.log(
                    f"{self.name} unreachable ({self.cause}); retrying for up to {self.give_up_after_s:g}s"
                )
            down = now - self._down_since
            if down >= self.give_up_after_s:
                raise DependencyDown(self.name, err, down) from err
            self.stats.retries += 1
            delay = min(self.max_delay_s, self.first_delay_s * 2 ** min(self._attempt, 16))
            self._attempt += 1
            return min(delay, self.give_up_after_s - down)

    def succeeded(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            down = self._clock() - self._down_since
            self._down_since = None
            self.stats.down_s += down
            self.log(f"{self.name} back after {down:.1f}s")

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()`, retried on the transient errors until it succeeds or the outage passes the bound."""
        while True:
            try:
                result = fn()
            except self.transient as err:
                if self.retry_if is not None and not self.retry_if(err):
                    raise
                self._sleep(self.failed(err))
                continue
            self.succeeded()
            return result


def resilience_metrics(dependencies: Iterable[Dependency]) -> dict[str, float]:
    """The step metrics of each dependency's outages in this process: `resilience/<name>_outages`,
    `_retries`, `_down_s` (ended outages) and `_degraded` (1 while one is open)."""
    out: dict[str, float] = {}
    for dep in dependencies:
        key = f"resilience/{dep.name}"
        out[f"{key}_outages"] = float(dep.stats.outages)
        out[f"{key}_retries"] = float(dep.stats.retries)
        out[f"{key}_down_s"] = dep.stats.down_s
        out[f"{key}_degraded"] = 1.0 if dep.degraded else 0.0
    return out

"""cascade.resilience: one outage per run of failures, bounded, logged once each way."""

from __future__ import annotations

import pytest

from cascade.resilience import Dependency, DependencyDown, resilience_metrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def make(clock: FakeClock, log: list[str], bound: float = 10.0) -> Dependency:
    return Dependency(
        "db", give_up_after_s=bound, transient=(ConnectionError,), log=log.append,
        first_delay_s=0.5, max_delay_s=2.0, clock=clock, sleep=clock.sleep,
    )


def failing_then(n: int, value: int = 7):
    calls = {"n": 0}

    def fn() -> int:
        calls["n"] += 1
        if calls["n"] <= n:
            raise ConnectionError("refused")
        return value

    return fn, calls


def test_retries_until_back_logs_once_each_way_and_counts_the_outage() -> None:
    clock, log = FakeClock(), []
    dep = make(clock, log)
    fn, calls = failing_then(3)
    assert dep.call(fn) == 7
    assert calls["n"] == 4
    # backoff 0.5, 1.0, 2.0 (capped at 2.0): 3.5 s down
    assert clock.now == pytest.approx(103.5)
    assert dep.stats.outages == 1 and dep.stats.retries == 3
    assert dep.stats.down_s == pytest.approx(3.5)
    assert len(log) == 2 and "unreachable" in log[0] and "ConnectionError" in log[0]
    assert log[1] == "db back after 3.5s"
    assert not dep.degraded


def test_the_bound_is_on_the_outage_not_on_each_call() -> None:
    clock, log = FakeClock(), []
    dep = make(clock, log, bound=3.0)

    def always() -> int:
        raise ConnectionError("down")

    with pytest.raises(DependencyDown) as err:
        dep.call(always)
    assert err.value.name == "db" and err.value.down_s == pytest.approx(3.0)
    assert "db unreachable for 3s" in str(err.value)
    assert dep.degraded  # still down: a second call gives up at once, it does not wait another 3 s
    before = clock.now
    with pytest.raises(DependencyDown):
        dep.call(always)
    assert clock.now == before


def test_backoff_restarts_with_each_new_outage() -> None:
    clock, log = FakeClock(), []
    dep = make(clock, log)
    dep.call(failing_then(3)[0])
    start = clock.now
    dep.call(failing_then(1)[0])
    assert clock.now - start == pytest.approx(0.5)
    assert dep.stats.outages == 2 and dep.stats.down_s == pytest.approx(4.0)


def test_errors_not_named_transient_are_raised_at_once() -> None:
    clock, log = FakeClock(), []
    dep = make(clock, log)

    def bug() -> int:
        raise KeyError("x")

    with pytest.raises(KeyError):
        dep.call(bug)
    assert dep.stats.outages == 0 and log == []


def test_a_negative_bound_is_refused_naming_the_dependency() -> None:
    with pytest.raises(ValueError, match="db: give_up_after_s"):
        Dependency("db", give_up_after_s=-1, transient=(OSError,), log=print)


def test_retry_if_narrows_the_transient_types() -> None:
    clock, log = FakeClock(), []
    dep = Dependency(
        "db",
        give_up_after_s=10,
        transient=(ConnectionError,),
        log=log.append,
        retry_if=lambda err: "refused" in str(err),
        clock=clock,
        sleep=clock.sleep,
    )
    assert dep.call(failing_then(2)[0]) == 7  # "refused": retried

    def other() -> int:
        raise ConnectionError("no such table: steps")

    with pytest.raises(ConnectionError, match="no such table"):
        dep.call(other)
    assert dep.stats.outages == 1 and not dep.degraded


def test_the_cause_is_one_line_in_the_log_the_error_and_the_stats() -> None:
    clock, log = FakeClock(), []
    dep = make(clock, log, bound=1.0)

    def chatty() -> int:
        raise ConnectionError("server closed the connection\n[SQL: SELECT 1]\n(Background: https://...)")

    with pytest.raises(DependencyDown) as err:
        dep.call(chatty)
    assert dep.cause == "ConnectionError: server closed the connection"
    assert "\n" not in str(err.value) and "\n" not in log[0]
    assert str(err.value).endswith("ConnectionError: server closed the connection")


def test_resilience_metrics_name_each_dependency() -> None:
    clock, log = FakeClock(), []
    dep = make(clock, log)
    dep.call(failing_then(2)[0])
    assert resilience_metrics([dep]) == {
        "resilience/db_outages": 1.0,
        "resilience/db_retries": 2.0,
        "resilience/db_down_s": pytest.approx(1.5),
        "resilience/db_degraded": 0.0,
    }

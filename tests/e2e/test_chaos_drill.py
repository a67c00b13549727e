"""The chaos drill (issue 21): ONE distributed cascade on the random tiny model (`LocalStack`,
supervised as `cascade up` runs it) against a PRIVATE Postgres and a PRIVATE Redis, during which
every fault below is injected once, each after a random number of trained steps, with no human
action:

- `postgres`: the run's database stopped (every connection cut) and started again ~2.5 s later;
- `redis`: the streams' Redis killed and started empty (no persistence) while the workers are
  stopped (SIGSTOP) with requests queued;
- `teacher`: the teacher service kill -9'd mid-stage 2, restarted on its port by the supervisor;
- `rollout_service`: the only rollout replica kill -9'd, restarted on its port by the supervisor;
- `rollout_worker`: a rollout worker kill -9'd while it holds a request, restarted by the supervisor;
- `celery_worker`: the Celery worker that scores math kill -9'd, restarted by the supervisor;
- `learner`: the learner kill -9'd and started again with `--resume` by the drill (what a
  Kubernetes or systemd supervisor does; `cascade up` itself only prints the command);
- `frozen_learner`: the learner SIGSTOPped past its lease's expiry, a new learner `--resume`d
  takes the lease over and trains, then the frozen one is let go (SIGCONT): its next write is
  refused by the lease's fence and it stops having written nothing (issue 34);
- `skewed_taker`: a second learner `--resume`d beside the live one, its clock a minute ahead
  (faketime) and in its own PID namespace (as on another host): the lease is live by the
  database's clock, so it is refused and the learner trains on.

The schedule comes from a seed, printed with the test's output and in every failure:
`CASCADE_CHAOS_SEED=<seed>` replays it. The cascade completes; its steps are contiguous with no
step row twice, no sample is trained twice (the samples log), each dependency's outage is in the
step metrics, the `outage` events and the learner's Prometheus counters, each killed process is
reported and restarted once, and the resumed learner holds the run's lease.

The reward service's Celery broker stays on the shared Redis (127.0.0.1:6379, skipped without
it): the private one carries the learner's and workers' streams. The embedded run's database
restart is tests/e2e/test_database_outage.py; runners frozen or cut off past their lease in one
process are tests/e2e/test_stale_runner.py.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from private_postgres import PrivatePostgres
from private_redis import PrivateRedis
from sqlalchemy import select
from stack_probe import dependency_series, trained

from cascade.runner.checkpoint import latest_checkpoint
from cascade.store import leases
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Event, RunLease
from cascade.up.stack import LocalStack, Proc, free_port

pytestmark = pytest.mark.postgres

SHARED_REDIS = os.environ.get("CASCADE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
STAGE_STEPS = (5, 8)  # if, then math distilled from if's teacher
STEPS = sum(STAGE_STEPS)
SLOTS = range(1, 10)
"""A fault fires once this many steps are trained (distinct per fault; the later steps leave room
for the last one to be ridden out and recorded)."""
STAGE_2_FAULTS = ("teacher", "celery_worker")  # the teacher serves stage 2; Celery scores math
OTHER_FAULTS = (
    "postgres",
    "redis",
    "rollout_service",
    "rollout_worker",
    "learner",
    "frozen_learner",
    "skewed_taker",
)
DEPENDENCIES = ("database", "redis", "teacher", "rollout")
SKEW_S = 60
"""How far ahead the skewed taker's clock runs."""


def schedule(seed: int) -> list[tuple[int, str]]:
    """(steps trained, fault), in firing order."""
    rng = random.Random(seed)
    late = rng.sample([s for s in SLOTS if s >= STAGE_STEPS[0]], len(STAGE_2_FAULTS))
    rest = rng.sample([s for s in SLOTS if s not in late], len(OTHER_FAULTS))
    return sorted([*zip(late, STAGE_2_FAULTS, strict=True), *zip(rest, OTHER_FAULTS, strict=True)])


def test_schedule_puts_each_fault_once_at_a_distinct_step_stage_2_faults_in_stage_2() -> None:
    for seed in range(200):
        plan = schedule(seed)
        assert sorted(name for _, name in plan) == sorted(STAGE_2_FAULTS + OTHER_FAULTS)
        assert len({at for at, _ in plan}) == len(plan) and all(at in SLOTS for at, _ in plan)
        assert all(at >= STAGE_STEPS[0] for at, name in plan if name in STAGE_2_FAULTS)
    assert schedule(7) == schedule(7)


def _redis_up(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=2).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def pg() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    yield server
    server.close()


def _step_of(checkpoint: Path | None) -> int:
    return -1 if checkpoint is None else int(checkpoint.name.split("-", 1)[1].split(".")[0])


class Drill:
    """The running stack and the faults injected into it, one at a time."""

    def __init__(
        self, stack: LocalStack, pg: PrivatePostgres, streams: PrivateRedis, db_url: str, seed: int
    ) -> None:
        self.stack, self.pg, self.streams, self.db_url, self.seed = stack, pg, streams, db_url, seed
        self.rng = random.Random(seed)
        self.repro = f"[replay with CASCADE_CHAOS_SEED={seed}]"
        self.prometheus: dict[str, float] = {}
        """Each dependency's outage counter scraped right after its outage ended."""
        self.engine = make_engine(db_url)
        self.stale: Proc | None = None
        """The learner `frozen_learner` let go after it was taken over."""

    @property
    def learner(self) -> Proc:
        return self.stack.procs["learner"]

    def steps(self) -> int:
        return len(trained(self.stack.run_dir))

    def trained_at_least(self, steps: int) -> bool:
        return self.steps() >= steps

    def wait(
        self, what: str, check: Callable[[], Any], timeout_s: float = 180, supervise: bool = True
    ) -> Any:
        """Until `check()` is true, the stack supervised meanwhile (unless `supervise` is False);
        fails if the learner exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            if supervise:
                self.stack.check()
            value = check()
            if value:
                return value
            learner = self.learner
            if not learner.alive():
                raise AssertionError(
                    f"the learner ended ({learner.exit_status()}) while waiting for {what} {self.repro}:\n"
                    f"{learner.log()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {what} within {timeout_s:g}s {self.repro}:\n{learner.log()[-4000:]}"
                )
            time.sleep(0.1)

    def outage_events(self) -> Counter[str]:
        """`outage` events by dependency (the private database holds this cascade alone)."""
        with session_scope(self.engine) as s:
            events = s.scalars(select(Event).where(Event.kind == "outage"))
            return Counter(str((e.detail or {}).get("dependency")) for e in events)

    def lease_pid(self) -> int | None:
        with session_scope(self.engine) as s:
            lease = s.scalars(select(RunLease)).one_or_none()
            return None if lease is None else lease.pid

    def log_count(self, text: str) -> int:
        return self.learner.log().count(text)

    def counts(self, dependency: str) -> tuple[int, int, int]:
        """Its outages logged begun and ended, and its `outage` events, before a fault."""
        return (
            self.log_count(f"{dependency} unreachable"),
            self.log_count(f"{dependency} back after"),
            self.outage_events()[dependency],
        )

    def ridden_out(self, dependency: str, before: tuple[int, int, int]) -> None:
        """Past the outage of `dependency`: its start and end logged, its Prometheus counter
        scraped, its `outage` event written (with the next step row)."""
        noticed, back, events = before
        self.wait(
            f"the learner to log {dependency}'s outage",
            lambda: self.log_count(f"{dependency} unreachable") > noticed,
        )
        self.wait(f"{dependency} back", lambda: self.log_count(f"{dependency} back after") > back)
        self.prometheus[dependency] = dependency_series(self.learner.metrics_port).get(dependency, 0.0)
        self.wait(f"{dependency}'s outage event", lambda: self.outage_events()[dependency] > events)

    # ------------------------------------------------------------------ the faults

    def postgres(self) -> None:
        before = self.counts("database")
        t0 = time.monotonic()
        self.pg.stop()
        self.wait(
            "the learner to find the database gone",
            lambda: self.log_count("database unreachable") > before[0],
            120,
        )
        time.sleep(max(0.0, 2.5 - (time.monotonic() - t0)))
        self.pg.start()
        self.ridden_out("database", before)

    def redis(self) -> None:
        before = self.counts("redis")
        workers = [p for n, p in self.stack.procs.items() if n.startswith("worker-")]
        client = redis.Redis.from_url(self.streams.url, socket_timeout=5)
        prompts = f"{self.stack.stream_prefix}:prompts"

        def queued() -> bool:  # taken and not acknowledged, or not taken yet
            groups = client.xinfo_groups(prompts)
            return any(int(g["pending"]) + int(g.get("lag") or 0) > 0 for g in groups)

        for w in workers:
            w.signal_group(signal.SIGSTOP)
        try:
            self.wait("requests queued", queued, 60)
            client.close()
            # down until the learner found it so (>= 1 s): a restart within redis-py's own
            # reconnect loses the streams without any failed call, which shows only as
            # `reissued_requests`, not as a `redis` outage
            t0 = time.monotonic()
            self.streams.stop()
            self.wait(
                "the learner to find Redis gone",
                lambda: self.log_count("redis unreachable") > before[0],
                120,
            )
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        finally:
            client.close()
            if self.streams.proc is None:
                self.streams.start()
            for w in workers:
                w.signal_group(signal.SIGCONT)
        self.ridden_out("redis", before)

    def _killed_service(self, name: str, dependency: str) -> None:
        """kill -9; the restart is held until the learner saw the service gone (a supervisor
        slower than the learner's next call), then the supervisor starts it on its port."""
        before = self.counts(dependency)
        restarts = self.stack.supervisor.restarts[name] if self.stack.supervisor else 0
        proc = self.stack.procs[name]
        proc.signal_group(signal.SIGKILL)
        self.wait(
            f"the learner to find {name} gone",
            lambda: self.log_count(f"{dependency} unreachable") > before[0],
            supervise=False,
        )
        self.wait(
            f"{name} restarted",
            lambda: self.stack.supervisor and self.stack.supervisor.restarts[name] > restarts,
        )
        self.ridden_out(dependency, before)

    def teacher(self) -> None:
        self._killed_service("teacher", "teacher")

    def rollout_service(self) -> None:
        self._killed_service("rollout", "rollout")

    def rollout_worker(self) -> None:
        name = self.rng.choice(sorted(n for n in self.stack.procs if n.startswith("worker-")))
        client = redis.Redis.from_url(self.streams.url, socket_timeout=5)
        prompts = f"{self.stack.stream_prefix}:prompts"

        def holds_a_request() -> bool:
            try:
                return bool(client.xpending_range(prompts, "rollout", "-", "+", 1, consumername=name))
            except redis.ResponseError:  # the group not made yet
                return False

        try:
            self.wait(f"{name} holding a request", holds_a_request, 120)
        finally:
            client.close()
        self._kill_and_see_restarted(name)

    def celery_worker(self) -> None:
        celery = self.stack.procs["celery-0"]
        self.wait("Celery scoring", lambda: "succeeded" in celery.log())
        self._kill_and_see_restarted("celery-0")

    def _kill_and_see_restarted(self, name: str) -> None:
        restarts = self.stack.supervisor.restarts[name] if self.stack.supervisor else 0
        done = self.steps()
        os.kill(self.stack.procs[name].pid, signal.SIGKILL)  # the main process, as `kill -9 PID`
        self.wait(
            f"{name} restarted",
            lambda: self.stack.supervisor and self.stack.supervisor.restarts[name] > restarts,
        )
        self.wait(f"a step after {name}'s restart", lambda: self.steps() > done)

    def learner_kill(self) -> None:
        """kill -9 once every step row so far has its checkpoint (the outages they record stay:
        a resume drops the rows past its checkpoint), then `--resume`, as a supervisor would."""
        self._checkpointed()
        old = self.learner
        os.kill(old.pid, signal.SIGKILL)
        assert old.popen is not None
        old.popen.wait(timeout=30)
        self.stack.resume = True
        new = self.stack.start_learner()
        self.wait("the resumed learner", lambda: "resumed from step-" in new.log())
        self.wait("the resumed learner's lease", lambda: self.lease_pid() == new.pid)
        # the next fault hits a learner that trains again: at its start the learner waits
        # --rollout-wait-s for the replicas, then stops (exit 75 with the resume command)
        resumed_at = self.steps()
        self.wait("a step of the resumed learner", lambda: self.steps() > resumed_at)

    def lease_expired(self) -> bool:
        with session_scope(self.engine) as s:
            lease = s.scalars(select(RunLease)).one_or_none()
            return lease is not None and not leases.is_live(lease, leases.db_now(s))

    def _checkpointed(self) -> None:
        """Every step row so far has its checkpoint (the outages they record stay: a resume drops
        the rows past its checkpoint)."""
        self.wait(
            "a checkpoint of the last step",
            lambda: _step_of(latest_checkpoint(self.stack.run_dir / "checkpoints")) >= self.steps() > 0,
        )

    def frozen_learner(self) -> None:
        """SIGSTOP past the lease's expiry (by the database's clock); a learner `--resume`d takes it
        over (a stopped process holds nothing) and trains; SIGCONT: the frozen one's next write is
        refused by the fence, it stops (exit 1) and no row or samples line of it lands."""
        self._checkpointed()
        old = self.learner
        assert old.popen is not None
        old.signal_group(signal.SIGSTOP)
        try:
            self.wait("the frozen learner's lease to expire", self.lease_expired, 120)
            self.stack.resume = True
            new = self.stack.start_learner()
            self.wait("the taker", lambda: "resumed from step-" in new.log())
            self.wait("the taker's lease", lambda: self.lease_pid() == new.pid)
            resumed_at = self.steps()
            self.wait("a step of the taker", lambda: self.steps() > resumed_at)
        finally:
            old.signal_group(signal.SIGCONT)
        self.stale = old  # its exit is checked once the cascade is done (the taker trains on meanwhile)

    def skewed_taker(self) -> None:
        """A second learner `--resume`d while the learner is live, its clock 60 s ahead and in a
        PID namespace of its own (so its pid check cannot help: only the clock decides)."""
        old = self.learner
        argv = list(old.argv)
        argv[argv.index("--metrics-port") + 1] = str(free_port())
        if "--resume" not in argv:
            argv.append("--resume")
        prefix: list[str] = []
        if shutil.which("unshare") and subprocess.run(["unshare", "--pid", "--fork", "true"]).returncode == 0:
            prefix += ["unshare", "--pid", "--fork", "--mount-proc"]
        if shutil.which("faketime"):
            prefix += ["faketime", "-f", f"+{SKEW_S}s"]
        else:
            print("  faketime missing (make faketime): the taker runs on the true clock")
        done = self.steps()
        # the learner kept mid-cascade meanwhile (its rollouts held back), however fast it trains
        workers = [p for n, p in self.stack.procs.items() if n.startswith("worker-")]
        for w in workers:
            w.signal_group(signal.SIGSTOP)
        try:
            taker = Proc("taker", [*prefix, *argv], self.stack.log_dir / "taker.log", env_extra=old.env_extra)
            taker.start({**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1", "OMP_NUM_THREADS": "1"})
            assert taker.popen is not None
            code = taker.popen.wait(timeout=180)
        finally:
            for w in workers:
                w.signal_group(signal.SIGCONT)
        assert code == 2 and "is being run by" in taker.log(), (code, taker.log()[-3000:], self.repro)
        if "faketime" in prefix:
            assert "ahead of the database's" in taker.log(), (taker.log()[-3000:], self.repro)
        assert self.lease_pid() == old.pid, self.repro
        self.wait("a step after the skewed taker", lambda: self.steps() > done)

    def inject(self, name: str) -> None:
        getattr(self, "learner_kill" if name == "learner" else name)()


def test_chaos_drill(e2e: Any, pg: PrivatePostgres, tmp_path: Path) -> None:
    if not _redis_up(SHARED_REDIS):
        pytest.skip(f"Redis unreachable at {SHARED_REDIS} (the reward service's broker)")
    seed = int(os.environ.get("CASCADE_CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    plan = schedule(seed)
    print(f"chaos drill: CASCADE_CHAOS_SEED={seed}; after step: " + ", ".join(f"{at} {f}" for at, f in plan))

    def edit(data: dict[str, Any]) -> None:
        data["rollout"] = {"seeding": "per_request", "prompts_per_request": 1}
        for stage, steps in zip(data["stages"], STAGE_STEPS, strict=True):
            stage["advance"]["max_steps"] = steps
            stage["eval"] = {"every": steps}
            stage["grpo"]["max_staleness"] = 1  # two batches in flight: requests always queued
        data["checkpoint"] = {"every": 1, "keep_last": 2}
        data["lease"] = {"heartbeat_s": 1, "expiry_s": 10}

    e2e.config(tmp_path, edit)
    db_url = pg.database("chaos")
    streams = PrivateRedis(tmp_path / "redis")
    streams.start()
    reports: list[str] = []
    stack = LocalStack(
        config=tmp_path / "cascade.yaml",
        model=e2e.model_path,
        run_dir=tmp_path / "run",
        log_dir=tmp_path / "logs",
        redis_url=streams.url,  # the learner's and workers' streams
        broker_url=SHARED_REDIS,  # the reward service's Celery broker
        db=db_url,
        stream_prefix=f"cascade:chaos:{uuid.uuid4().hex[:8]}",
        workers=2,
        celery_workers=1,
        claim_idle_ms=5000,  # a killed worker's request is taken over after 5 s
        supervise=True,
        reward_flags=["--remote-domains", "math", "--task-timeout-s", "120"],
        process_env={
            "CASCADE_REWARD_SANDBOX_CHECK": "0",  # math only: no code to sandbox
            "CASCADE_REWARD_VISIBILITY_TIMEOUT_S": "5",  # a killed Celery worker's task back in 5 s
            "CASCADE_REWARD_RESTORE_INTERVAL_S": "1",
        },
        report=reports.append,
    )
    drill = Drill(stack, pg, streams, db_url, seed)
    t0 = time.monotonic()
    try:
        stack.start_services(timeout_s=180)
        for i in range(stack.workers):
            stack.worker(i)
        stack.start_learner()
        for at, fault in plan:
            drill.wait(f"step {at} before the {fault} fault", partial(drill.trained_at_least, at), 300)
            print(f"  {time.monotonic() - t0:5.0f}s after step {drill.steps()}: {fault}")
            drill.inject(fault)
        code = stack.wait(timeout_s=400)
        learner_log = (tmp_path / "logs" / "learner.log").read_text()
        assert code == 0, f"{drill.repro}\n{drill.learner.log()[-4000:]}"
        assert drill.stale is not None and drill.stale.popen is not None, drill.repro
        stale_code = drill.stale.popen.wait(timeout=120)
        assert stale_code == 1, (stale_code, drill.repro)  # stopped: its lease was taken over
        celery_log = stack.procs["celery-0"].log()
        restarts = dict(stack.supervisor.restarts) if stack.supervisor else {}
        events = drill.outage_events()
    finally:
        if drill.stale is not None and drill.stale.alive():
            drill.stale.signal_group(signal.SIGKILL)
        stack.stop()
        streams.stop()
        drill.engine.dispose()
    print(
        f"chaos drill: {time.monotonic() - t0:.0f}s wall; restarts {restarts}; Prometheus {drill.prometheus}"
    )

    rows = e2e.rows(db_url)
    assert rows.run_status == "completed", drill.repro
    assert [g for _, _, g, _ in rows.steps] == list(range(1, STEPS + 1)), drill.repro  # contiguous
    assert len({(stage, step) for stage, step, _, _ in rows.steps}) == STEPS, drill.repro  # no row twice
    steps = trained(tmp_path / "run")
    assert len(steps) == STEPS and all(len(s) == 4 * 4 for s in steps), drill.repro
    ids = Counter(sid for s in steps for sid in s)
    assert [sid for sid, n in ids.items() if n > 1] == [], f"a sample trained twice {drill.repro}"
    metrics = [m for _, _, _, m in rows.steps]
    # the killed Celery worker's task came back to the queue and was scored: no step trained
    # with a sample the verifier failed on
    assert [m["verifier_failure_fraction"] for m in metrics] == [0.0] * STEPS, drill.repro
    for dep in DEPENDENCIES:
        assert max(m.get(f"resilience/{dep}_outages", 0) for m in metrics) >= 1, (dep, drill.repro)
        assert max(m.get(f"resilience/{dep}_down_s", 0) for m in metrics) > 0, (dep, drill.repro)
        assert events[dep] >= 1, (dep, events, drill.repro)
        assert drill.prometheus.get(dep, 0) >= 1, (dep, drill.prometheus, drill.repro)
    worker = next(n for n in restarts if n.startswith("worker-"))
    assert restarts == {"teacher": 1, "rollout": 1, worker: 1, "celery-0": 1}, (restarts, drill.repro)
    text = "\n".join(reports)
    for name in restarts:
        assert f"{name} (pid " in text and "died: killed by SIGKILL" in text, (name, drill.repro)
    assert learner_log.count("resumed from step-") == 2, drill.repro  # the kill, the frozen learner
    assert learner_log.count("learner stopped: another runner took this cascade over") == 1, drill.repro
    assert "re-issued" in learner_log, drill.repro  # requests lost with Redis
    assert "Traceback" not in drill.learner.log(), drill.repro
    assert "succeeded" in celery_log, drill.repro  # the restarted Celery worker scored

"""Several rollout replicas: the learner's push to all (one version offset, failures taken out and
re-admitted with the current weights when they answer again, all down an outage bounded by the
`rollout` dependency, DNS re-resolution) and the workers' spread with the per-request version
check, against fake replicas that keep versions as the engines do (`next_version`: only growing)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from cascade.engine.base import (
    Generation,
    SamplingSettings,
    TurnStep,
    VersionedGeneration,
    WeightUpdateError,
    next_version,
)
from cascade.resilience import Dependency, DependencyDown
from cascade.transport.rollout_replicas import (
    Addresses,
    NoReplicaReady,
    ReplicaPool,
    resolve,
    split_addresses,
)
from services.learner.replicas import NoReplicaLeft, RolloutReplicas

SAMPLING = SamplingSettings(max_tokens=2, seed=1)


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass
class FakeReplica:
    """One rollout service: its version only grows; `dead` answers UNAVAILABLE."""

    version: int = 0
    dead: bool = False
    generated: int = 0
    pushes: list[int] = field(default_factory=list)
    barrier: threading.Barrier | None = None
    rounds: list[tuple[str, int]] = field(default_factory=list)  # (rollout, round) of multi-turn requests

    def _alive(self) -> None:
        if self.dead:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")

    def model_info(self, **kw: Any) -> tuple[None, int]:
        self._alive()
        return None, self.version

    def update_weights(self, path: str, version: int | None = None) -> None:
        self._alive()
        if self.barrier is not None:
            self.barrier.wait()  # passes only when every replica is being pushed to at once
        try:
            self.version = next_version(self.version, version)
        except WeightUpdateError as err:
            raise FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
        self.pushes.append(self.version)

    def generate(self, prompts: list[list[int]], *, group_size: int, sampling: SamplingSettings) -> Any:
        self._alive()
        self.generated += 1
        if sampling.turn is not None:
            self.rounds.append((sampling.turn.rollout, sampling.turn.round))
        gen = Generation(completion_ids=[[1]], logprobs=[[0.0]], finish_reasons=["stop"])
        return type("Reply", (), {"result": VersionedGeneration(gen, self.version, group_size)})()


class Cluster:
    def __init__(self, **replicas: FakeReplica) -> None:
        self.replicas = dict(replicas)
        self.closed: list[str] = []

    def client(self, address: str) -> Any:
        replica = self.replicas[address]
        cluster = self

        class Client:
            def __getattr__(self, name: str) -> Any:
                return getattr(replica, name)

            def close(self) -> None:
                cluster.closed.append(address)

        return Client()


Learner = tuple[RolloutReplicas, list[str], list[Any]]


def learner(cluster: Cluster, addresses: Addresses, **kw: Any) -> Learner:
    lines: list[str] = []
    failures: list[Any] = []
    r = RolloutReplicas(
        addresses,
        log=lines.append,
        on_failure=lambda a, d: failures.append((a, d)),
        client=cluster.client,
        wait_s=0.0,
        sleep=lambda s: None,
        **kw,
    )
    return r, lines, failures


# ---------------------------------------------------------------------- addresses


def test_addresses_parse_lists_and_names() -> None:
    assert split_addresses(" a:1, b:2,a:1,") == ["a:1", "b:2"]
    with pytest.raises(ValueError, match="host:port"):
        split_addresses("a:1,nohost")
    with pytest.raises(ValueError, match="no rollout address"):
        Addresses.parse("", None)
    with pytest.raises(ValueError, match="expected host:port"):
        Addresses.parse(None, "rollout-headless")
    assert "127.0.0.1:50052" in resolve("localhost:50052")
    assert resolve("no-such-name.invalid:1") == []
    names = {"svc:9": ["10.0.0.2:9", "10.0.0.1:9"]}
    both = Addresses(["x:1"], "svc:9", resolver=lambda n: names[n])
    assert both.current() == ["x:1", "10.0.0.2:9", "10.0.0.1:9"]


# ---------------------------------------------------------------------- learner: versions


def test_one_offset_above_every_replica_so_a_resumed_learner_pushes_upward() -> None:
    """Replicas at engine versions 7 and 3 (served an earlier process); the learner resumes at
    its checkpoint's version 4: it cannot push 4 (7 would refuse it), so it pushes 4 + offset to
    both, the same number on both, and every later version keeps the same offset."""
    cluster = Cluster(a=FakeReplica(version=7), b=FakeReplica(version=3))
    r, _, failures = learner(cluster, Addresses(["a", "b"]))
    r.attach(4)
    assert r.offset == 7 + 1 - 4
    r.push("/w/v4", 4)
    r.push("/w/v5", 5)
    assert cluster.replicas["a"].pushes == cluster.replicas["b"].pushes == [8, 9]
    assert failures == []
    # a fresh learner (version 0) on the same replicas: above them again
    fresh, _, _ = learner(cluster, Addresses(["a", "b"]))
    fresh.attach(0)
    fresh.push("/w/v0", 0)
    assert cluster.replicas["a"].pushes[-1] == 10 and fresh.offset == 10


def test_push_goes_to_every_replica_at_once() -> None:
    barrier = threading.Barrier(3, timeout=5)  # three pushes must be in flight together
    cluster = Cluster(**{k: FakeReplica(barrier=barrier) for k in "abc"})
    r, _, _ = learner(cluster, Addresses(["a", "b", "c"]))
    r.attach(0)
    metrics = r.push("/w", 0)
    assert [cluster.replicas[k].version for k in "abc"] == [1, 1, 1]
    assert (metrics["rollout_replicas"], metrics["replicas_out"], metrics["replica_failures"]) == (3, 0, 0)


def test_a_failed_replica_is_taken_out_then_readmitted_with_the_weights_once_it_answers() -> None:
    cluster = Cluster(a=FakeReplica(), b=FakeReplica())
    r, lines, failures = learner(cluster, Addresses(["a", "b"]))
    r.attach(0)
    r.push("/w/0", 0)
    cluster.replicas["b"].dead = True
    metrics = r.push("/w/1", 1)
    assert (metrics["rollout_replicas"], metrics["replicas_out"], metrics["replica_failures"]) == (1, 1, 1)
    assert failures == [("b", "push")]
    assert any("ERROR rollout replica b taken out" in line and "UNAVAILABLE" in line for line in lines)
    metrics = r.push("/w/2", 2)  # still down: probed, still out, neither logged nor counted again
    assert metrics["replica_failures"] == 0 and metrics["replicas_out"] == 1
    assert sum("ERROR" in line for line in lines) == 1 and failures == [("b", "push")]
    for _ in range(4):  # unscored generation only from the replica in service
        r.generate([[1]], 1, SAMPLING)
    assert cluster.replicas["b"].generated == 0 and cluster.replicas["a"].generated == 4
    cluster.replicas["b"] = FakeReplica(pushes=[1])  # restarted on its address: version 0
    metrics = r.push("/w/3", 3)
    assert metrics["rollout_replicas"] == 2 and metrics["replicas_out"] == 0 and r.readmitted == 1
    assert cluster.replicas["b"].pushes == [1, 4] and cluster.replicas["a"].pushes == [1, 2, 3, 4]
    assert any("rollout replica b answers again (it held engine version 0)" in line for line in lines)
    cluster.replicas["a"].dead = cluster.replicas["b"].dead = True
    with pytest.raises(DependencyDown, match="no rollout replica holds version 4"):
        r.push("/w/4", 4)  # no outage allowed by default: every replica down stops at once


def test_every_replica_down_is_an_outage_ridden_out_until_one_answers_again() -> None:
    """All replicas down: pushes and generation wait (the `rollout` outage, logged once each way,
    counted) for one that answers, give it the current weights first, and go on; a replica
    restarted between two pushes (older weights than it was given) gets them again at `heal`;
    past the bound, `DependencyDown`."""
    cluster = Cluster(a=FakeReplica())
    clock, lines = [0.0], []
    back_at = [3.0]

    def sleep(s: float) -> None:
        clock[0] += s
        if clock[0] >= back_at[0] and cluster.replicas["a"].dead:
            cluster.replicas["a"] = FakeReplica(pushes=cluster.replicas["a"].pushes)  # restarted

    outage = Dependency(
        "rollout",
        give_up_after_s=10.0,
        transient=(NoReplicaLeft,),
        log=lines.append,
        clock=lambda: clock[0],
        sleep=sleep,
    )
    r = RolloutReplicas(
        Addresses(["a"]), log=lines.append, client=cluster.client, wait_s=0.0, sleep=sleep, outage=outage
    )
    r.attach(0)
    r.push("/w/0", 0)
    cluster.replicas["a"].dead = True
    metrics = r.push("/w/1", 1)  # waits ~3 s for a to come back, then pushes to it
    assert metrics["rollout_replicas"] == 1 and cluster.replicas["a"].pushes == [1, 2]
    assert outage.stats.outages == 1 and 3.0 <= outage.stats.down_s < 10.0 and not outage.degraded
    outage_lines = [line.split(" (")[0] for line in lines if line.startswith(("rollout unr", "rollout back"))]
    assert outage_lines == ["rollout unreachable", "rollout back after 3.0s"]
    cluster.replicas["a"].version = 0  # restarted between two probes
    r.heal()
    assert cluster.replicas["a"].version == 2 and "a" in r.active
    slow = FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "busy")
    cluster.replicas["a"].model_info = lambda **kw: (_ for _ in ()).throw(slow)  # type: ignore[method-assign]
    r.heal()  # a probe that times out: busy, not gone
    assert "a" in r.active and not outage.degraded
    del cluster.replicas["a"].model_info
    cluster.replicas["a"].dead = True
    r.heal()  # down: taken out, the outage opens
    assert not r.active and outage.degraded and outage.stats.outages == 2
    back_at[0] = clock[0] + 1.0
    assert r.generate([[1]], 1, SAMPLING).version == 2  # re-admitted with the weights, then asked
    assert cluster.replicas["a"].pushes[-1] == 2 and not outage.degraded
    cluster.replicas["a"].dead, back_at[0] = True, float("inf")
    with pytest.raises(DependencyDown, match="rollout unreachable for 10s"):
        r.push("/w/2", 2)


def test_a_refused_update_takes_the_replica_out() -> None:
    """A replica some other (newer) learner pushed beyond our versions refuses ours: out."""
    cluster = Cluster(a=FakeReplica(), b=FakeReplica())
    r, lines, failures = learner(cluster, Addresses(["a", "b"]))
    r.attach(0)
    cluster.replicas["b"].version = 100
    metrics = r.push("/w/0", 0)
    assert metrics["replicas_out"] == 1 and failures == [("b", "push")]
    assert any("INVALID_ARGUMENT" in line and "not above" in line for line in lines)
    metrics = r.push("/w/1", 1)  # it answers, but refuses again: still out, not counted twice
    assert metrics["replicas_out"] == 1 and failures == [("b", "push")] and r.readmitted == 0


def test_dns_re_resolution_adds_new_replicas_and_re_adds_a_returning_one() -> None:
    listed = ["10.0.0.1:5", "10.0.0.2:5"]
    cluster = Cluster(**{a: FakeReplica() for a in ["10.0.0.1:5", "10.0.0.2:5", "10.0.0.3:5"]})
    r, lines, failures = learner(cluster, Addresses([], "rollout:5", resolver=lambda n: list(listed)))
    r.attach(0)
    r.push("/w/0", 0)
    cluster.replicas["10.0.0.2:5"].dead = True
    assert r.push("/w/1", 1)["replicas_out"] == 1
    # still listed, still out: not pushed to
    r.push("/w/2", 2)
    assert cluster.replicas["10.0.0.2:5"].pushes == [1]
    # it leaves the DNS answer (pod restarted), a third pod appears; then it is listed again
    cluster.replicas["10.0.0.2:5"].dead = False
    listed[:] = ["10.0.0.1:5", "10.0.0.3:5"]
    metrics = r.push("/w/3", 3)
    assert metrics["rollout_replicas"] == 2 and metrics["replicas_out"] == 0
    assert cluster.replicas["10.0.0.3:5"].version == 4  # got the current weights when found
    listed.append("10.0.0.2:5")
    metrics = r.push("/w/4", 4)
    assert metrics["rollout_replicas"] == 3
    assert cluster.replicas["10.0.0.2:5"].pushes == [1, 5]
    assert any("10.0.0.3:5 found" in line for line in lines)
    # a replica the name no longer lists is not pushed to
    listed.remove("10.0.0.1:5")
    r.push("/w/5", 5)
    assert cluster.replicas["10.0.0.1:5"].pushes[-1] == 5 and cluster.replicas["10.0.0.3:5"].version == 6


def test_attach_takes_out_an_unreachable_replica_and_needs_one() -> None:
    cluster = Cluster(a=FakeReplica(version=2), b=FakeReplica(dead=True))
    r, _, failures = learner(cluster, Addresses(["a", "b"]))
    r.attach(0)
    assert r.offset == 3 and failures == [("b", "attach")] and set(r.active) == {"a"}
    cluster = Cluster(a=FakeReplica(dead=True))
    r, _, _ = learner(cluster, Addresses(["a"]))
    with pytest.raises(NoReplicaLeft):
        r.attach(0)


def test_unscored_generation_never_takes_old_weights() -> None:
    """A replica in service that answers with older weights than the last push (restarted behind
    the learner's back) is taken out and the next one answers."""
    cluster = Cluster(a=FakeReplica(), b=FakeReplica())
    r, _, failures = learner(cluster, Addresses(["a", "b"]))
    r.attach(0)
    r.push("/w/0", 0)
    cluster.replicas["a"].version = 0  # restarted
    versions = {r.generate([[1]], 1, SAMPLING).version for _ in range(3)}
    assert versions == {1} and failures == [("a", "generate")]


# ---------------------------------------------------------------------- worker: per request


def pool(cluster: Cluster, addresses: list[str], **kw: Any) -> ReplicaPool:
    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += s

    return ReplicaPool(Addresses(addresses), client=cluster.client, clock=lambda: clock[0], sleep=sleep, **kw)


def test_requests_spread_round_robin() -> None:
    cluster = Cluster(a=FakeReplica(version=3), b=FakeReplica(version=3))
    p = pool(cluster, ["a", "b"])
    for _ in range(6):
        assert p.generate([[1]], 1, SAMPLING, min_version=3).version == 3
    assert cluster.replicas["a"].generated == cluster.replicas["b"].generated == 3


def test_a_stale_reply_is_not_used_another_replica_answers() -> None:
    """Replica a missed the learner's last push (taken out there): a request expecting version 5
    is answered by b, and a is asked its version (cheap) before it gets work again."""
    cluster = Cluster(a=FakeReplica(version=4), b=FakeReplica(version=5))
    p = pool(cluster, ["a", "b"])
    for _ in range(4):
        assert p.generate([[1]], 1, SAMPLING, min_version=5).version == 5
    assert cluster.replicas["a"].generated == 1  # one stale reply, then skipped
    assert p.stale_replies == 1
    cluster.replicas["a"].version = 5  # it caught up: used again
    for _ in range(4):
        p.generate([[1]], 1, SAMPLING, min_version=5)
    assert cluster.replicas["a"].generated == 3
    # a newer version than asked for is fine (staleness >= 1: fresher weights)
    assert p.generate([[1]], 1, SAMPLING, min_version=4).version == 5


def test_no_replica_new_enough_waits_then_raises_and_an_unreachable_one_rests() -> None:
    cluster = Cluster(a=FakeReplica(version=1), b=FakeReplica(dead=True))
    p = pool(cluster, ["a", "b"], wait_s=2.0, down_s=5.0)
    with pytest.raises(NoReplicaReady, match=r"a at version 1, b unreachable"):
        p.generate([[1]], 1, SAMPLING, min_version=2)
    cluster.replicas["a"].version = 2
    assert p.generate([[1]], 1, SAMPLING, min_version=2).version == 2


def test_a_bad_request_is_not_retried_elsewhere() -> None:
    cluster = Cluster(a=FakeReplica())

    def refuse(*a: Any, **k: Any) -> Any:
        raise FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "prompts[0]: empty")

    cluster.replicas["a"].generate = refuse  # type: ignore[method-assign]
    with pytest.raises(grpc.RpcError):
        pool(cluster, ["a"]).generate([[1]], 1, SAMPLING, min_version=0)


# ---------------------------------------------------------------------- multi-turn rollouts


def _round(rollout: str, r: int) -> SamplingSettings:
    return SamplingSettings(max_tokens=2, seed=1, turn=TurnStep("w", rollout, r, (0,) if r else ()))


def test_a_rollouts_rounds_go_to_the_replica_that_served_its_last_round() -> None:
    """That replica holds the keys/values the round reuses; round 0 and other requests spread."""
    cluster = Cluster(a=FakeReplica(version=3), b=FakeReplica(version=3), c=FakeReplica(version=3))
    p = pool(cluster, ["a", "b", "c"])
    for r in range(3):  # two rollouts interleaved, with a request on its own between
        for rollout in ("x", "y"):
            p.generate([[1]], 1, _round(rollout, r), min_version=3)
        p.generate([[1]], 1, SAMPLING, min_version=3)
    seen = {name: rep.rounds for name, rep in cluster.replicas.items()}
    assert seen["a"] == [("x", 0), ("x", 1), ("x", 2)] and seen["b"] == [("y", 0), ("y", 1), ("y", 2)]
    assert cluster.replicas["c"].generated == 3  # the spread goes on around them
    cluster.replicas["a"].dead = True  # x's replica fails: its next round goes elsewhere, and stays
    p.generate([[1]], 1, _round("x", 3), min_version=3)
    p.generate([[1]], 1, _round("x", 4), min_version=3)
    moved = [name for name, rep in cluster.replicas.items() if ("x", 3) in rep.rounds]
    assert len(moved) == 1 and moved[0] != "a" and ("x", 4) in cluster.replicas[moved[0]].rounds


def test_the_learners_rounds_stay_on_one_replica_too() -> None:
    cluster = Cluster(a=FakeReplica(), b=FakeReplica())
    r, _, _ = learner(cluster, Addresses(["a", "b"]))
    r.attach(0)
    r.push("/w/0", 0)
    for k in range(3):
        r.generate([[1]], 1, _round("x", k))
        r.generate([[1]], 1, SAMPLING)
    rounds = [rep.rounds for rep in cluster.replicas.values()]
    assert sorted(rounds) == [[], [("x", 0), ("x", 1), ("x", 2)]]

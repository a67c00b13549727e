"""The learner's Redis streams ride out a Redis restart (`services.learner.sources.StreamRollouts`
on a PRIVATE redis-server without persistence, killed and started again on its port): the
streams and groups are made again, the requests not back are re-issued, a lost request's late
first answer is used once; past `resilience.redis_s` the learner stops with `DependencyDown`."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from private_redis import PrivateRedis

from cascade.resilience import Dependency, DependencyDown, resilience_metrics
from cascade.rollout.requests import PromptRequest, ScoredChunk
from cascade.transport.redis_streams import TRANSIENT, StreamGroup, connect, publish
from services.learner.sources import StreamRollouts


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    try:
        server = PrivateRedis(tmp_path / "redis")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class NoReplicas:
    """The rollout side is not under test here: nothing to attach, heal or offset."""

    offset = 0

    def __init__(self) -> None:
        self.outage = Dependency("rollout", give_up_after_s=0.0, transient=(ConnectionError,), log=print)

    def attach(self, version: int) -> None:
        pass

    def heal(self) -> None:
        pass

    def close(self) -> None:
        pass


def request(batch: int, index: int, attempt: str) -> PromptRequest:
    sample_ids = [[f"b{batch}/r{index}/c{c}" for c in range(2)]]
    return PromptRequest(
        batch=batch, index=index, domain="math", policy_version=0, seed=index, group_size=2,
        max_tokens=4, temperature=1.0, top_p=1.0, overlong="keep",
        problems=[{"id": f"p{index}", "domain": "math", "prompt": "1+1", "answer": "2", "meta": {}}],
        prompt_ids=[[1, 2]], sample_ids=sample_ids, attempt=attempt,
    )  # fmt: skip


def answer(data: dict[str, Any], worker: str) -> dict[str, Any]:
    req = PromptRequest.from_json(data)
    chunk = ScoredChunk(
        batch=req.batch, index=req.index, worker=worker, engine_version=0, sample_ids=req.sample_ids,
        completion_ids=[[3], [4]], logprobs=[[-1.0], [-1.0]], finish_reasons=["stop", "stop"],
        texts=["2", "3"], verdicts=[(1.0, "ok", ""), (0.0, "wrong", "")], attempt=req.attempt,
    )  # fmt: skip
    return chunk.to_json()


def learner(server: PrivateRedis, bound_s: float, lines: list[str]) -> StreamRollouts:
    outage = Dependency("redis", give_up_after_s=bound_s, transient=TRANSIENT, log=lines.append)
    rollouts = StreamRollouts(
        redis_url=server.url,
        stream_prefix=f"cascade:blip:{uuid.uuid4().hex[:6]}",
        rollout=NoReplicas(),  # type: ignore[arg-type]
        weights_root=server.workdir / "weights",
        log=lines.append,
        redis_outage=outage,
    )
    rollouts.attach(None, None, lambda: 0)  # type: ignore[arg-type]
    return rollouts


def wait_for(what: str, cond: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_redis_restarted_without_persistence_while_the_learner_waits(private_redis: PrivateRedis) -> None:
    """Batch 0 has three requests: 0 answered before the restart, 1 taken by a worker that
    answers it only after the restart (its first answer), 2 still queued. Redis is killed and
    started empty: the learner makes the streams again and re-issues 1 and 2; the worker takes
    both; request 1 comes back twice and is used once."""
    lines: list[str] = []
    rollouts = learner(private_redis, bound_s=60.0, lines=lines)
    attempt = "a1"
    rollouts._attempt = attempt
    rollouts.submit([request(0, i, attempt) for i in range(3)])
    worker_redis = connect(private_redis.url)
    keys = rollouts.keys
    worker = StreamGroup(worker_redis, keys.prompts, "rollout", "w")
    taken = worker.read(count=2, block_ms=100)
    assert [m.data["index"] for m in taken] == [0, 1]
    publish(worker_redis, keys.groups, answer(taken[0].data, "w"))
    worker.ack(taken[0].id)

    result: dict[str, Any] = {}

    def collect() -> None:
        try:
            result["chunks"] = rollouts.collect(0)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            result["error"] = err

    thread = threading.Thread(target=collect)
    thread.start()
    wait_for("request 0 back", lambda: 0 in rollouts._chunks.get(0, {}))
    private_redis.restart(down_s=1.0)  # every key gone: the streams, both groups, request 2
    publish(worker_redis, keys.groups, answer(taken[1].data, "w"))  # the late first answer of 1
    again: list[Any] = []
    deadline = time.monotonic() + 30
    while len(again) < 2 and time.monotonic() < deadline:  # the worker joins the re-made group
        for message in worker.read(count=2, block_ms=200):
            again.append(message)
            publish(worker_redis, keys.groups, answer(message.data, "w"))
            worker.ack(message.id)
    thread.join(timeout=30)
    worker_redis.close()
    assert not thread.is_alive() and "error" not in result, result
    assert sorted(m.data["index"] for m in again) == [1, 2]
    assert sorted(c.index for c in result["chunks"]) == [0, 1, 2]
    stats = rollouts.stats()
    assert stats["reissued_requests"] == 2 and stats["duplicate_chunks"] == 1, stats
    outage = resilience_metrics([rollouts.redis_outage])
    assert outage["resilience/redis_outages"] == 1 and outage["resilience/redis_down_s"] >= 0.5, outage
    assert outage["resilience/redis_degraded"] == 0
    assert sum("redis unreachable" in line for line in lines) == 1, lines
    assert sum("redis back after" in line for line in lines) == 1, lines
    assert any("re-issued 2 request(s)" in line for line in lines), lines
    rollouts.finish()
    rollouts.close()


def test_redis_down_past_its_bound_stops_the_learner(private_redis: PrivateRedis) -> None:
    lines: list[str] = []
    rollouts = learner(private_redis, bound_s=1.5, lines=lines)
    rollouts._attempt = "a1"
    rollouts.submit([request(0, 0, "a1")])
    private_redis.stop()
    t0 = time.monotonic()
    with pytest.raises(DependencyDown, match=r"redis unreachable for \ds \(bound reached\): ConnectionError"):
        rollouts.collect(0)
    assert 1.5 <= time.monotonic() - t0 < 10
    assert sum("redis unreachable" in line for line in lines) == 1, lines
    rollouts.close()


def test_a_worker_exits_75_when_redis_stays_away_past_its_bound(tmp_path: Path) -> None:
    """`--redis-wait-s 1` and no Redis on the port: one warning, then exit 75 (EX_TEMPFAIL) with
    the reason; a supervisor may start it again."""
    import subprocess
    import sys

    from cascade.up.stack import REPO, free_port

    argv = [
        sys.executable,
        "-m",
        "services.rollout.worker",
        "--redis-url",
        f"redis://127.0.0.1:{free_port()}/0",
    ]
    argv += ["--stream-prefix", "cascade:blip:none", "--rollout", "127.0.0.1:1", "--reward", "127.0.0.1:1"]
    argv += ["--tokenizer", str(tmp_path), "--redis-wait-s", "1"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 75, done.stderr[-2000:]
    assert done.stderr.count("redis unreachable") == 2, done.stderr[-2000:]  # begun, then the stop
    assert "worker stopped: redis unreachable for 1s (bound reached): ConnectionError" in done.stderr


def test_a_taken_over_learner_takes_nothing_and_the_new_one_gets_back_what_it_lost(
    private_redis: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: a learner frozen past its lease and taken over reads the run's results stream when
    it wakes, until its heartbeat notices: an answer of the new learner's attempt that it reads,
    it drops. Once its lease is known lost it takes nothing more (`stop_when`), and the new
    learner publishes again a request a worker answered whose answer never came back
    (`LOST_AFTER_S`), and completes."""
    import services.learner.sources as sources
    from cascade.runner.sources import SourceStopped

    monkeypatch.setattr(sources, "LOST_AFTER_S", 0.5)
    monkeypatch.setattr(sources, "HEAL_EVERY_S", 0.1)
    lines: list[str] = []
    new = learner(private_redis, bound_s=30.0, lines=lines)
    stale = StreamRollouts(
        redis_url=private_redis.url,
        stream_prefix=new.keys.prefix,
        rollout=NoReplicas(),  # type: ignore[arg-type]
        weights_root=private_redis.workdir / "weights",
        log=lines.append,
    )
    stale._results = StreamGroup(stale.redis, stale.keys.groups, "learner", "learner")  # as it was before
    new._attempt = "new"
    new.submit([request(0, i, "new") for i in range(2)])
    worker_redis = connect(private_redis.url)
    worker = StreamGroup(worker_redis, new.keys.prompts, "rollout", "w")
    for message in worker.read(count=2, block_ms=200):
        publish(worker_redis, new.keys.groups, answer(message.data, "w"))
        worker.ack(message.id)

    # the stale learner wakes and drains once before its heartbeat notices: request 0 or 1 lost
    stale._attempt, stale._chunks[7], stale._requests[7] = "stale", {}, [request(7, 0, "stale")]
    stale._drain(block_ms=200)
    assert any("another attempt (new)" in line for line in lines), lines
    lost = True
    stale.stop_when(lambda: lost)
    with pytest.raises(SourceStopped, match="lease was taken over"):
        stale.collect(7)

    result: dict[str, Any] = {}

    def collect() -> None:
        result["chunks"] = new.collect(0)

    thread = threading.Thread(target=collect)
    thread.start()
    deadline = time.monotonic() + 20
    while thread.is_alive() and time.monotonic() < deadline:  # the worker answers the re-issue
        for message in worker.read(count=2, block_ms=200):
            publish(worker_redis, new.keys.groups, answer(message.data, "w"))
            worker.ack(message.id)
    thread.join(timeout=5)
    worker_redis.close()
    stale.redis.close()
    assert not thread.is_alive(), lines
    assert sorted(c.index for c in result["chunks"]) == [0, 1]
    assert any("re-issued 2 requests of batch 0" in line for line in lines), lines


def test_a_slow_request_is_not_published_again(
    private_redis: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request a worker still holds (a long generation), or that no worker took yet, is never
    taken for lost, however long it takes: only a finished request whose answer did not come back."""
    import services.learner.sources as sources

    monkeypatch.setattr(sources, "LOST_AFTER_S", 0.3)
    monkeypatch.setattr(sources, "HEAL_EVERY_S", 0.1)
    lines: list[str] = []
    rollouts = learner(private_redis, bound_s=30.0, lines=lines)
    rollouts._attempt = "a"
    rollouts.submit([request(0, i, "a") for i in range(3)])
    worker_redis = connect(private_redis.url)
    worker = StreamGroup(worker_redis, rollouts.keys.prompts, "rollout", "w")
    held = worker.read(count=2, block_ms=200)  # request 2 stays queued
    publish(worker_redis, rollouts.keys.groups, answer(held[0].data, "w"))
    worker.ack(held[0].id)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(chunks=rollouts.collect(0)))
    thread.start()
    time.sleep(1.5)  # five times the bound: request 1 held, request 2 queued
    publish(worker_redis, rollouts.keys.groups, answer(held[1].data, "w"))
    worker.ack(held[1].id)
    for message in worker.read(count=1, block_ms=2000):
        publish(worker_redis, rollouts.keys.groups, answer(message.data, "w"))
        worker.ack(message.id)
    thread.join(timeout=10)
    worker_redis.close()
    assert not thread.is_alive() and sorted(c.index for c in result["chunks"]) == [0, 1, 2]
    assert rollouts.stats()["reissued_requests"] == 0 and not any("re-issued" in line for line in lines)

"""The Redis-stream helpers on the local Redis (skipped without one): consumer groups hand each
message to one consumer, unacknowledged ones can be claimed by another, a reset stream is
recreated."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from cascade.transport.redis_streams import StreamGroup, StreamKeys, connect, publish, reset

REDIS_URL = os.environ.get("CASCADE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def keys() -> Iterator[StreamKeys]:
    import redis

    client = connect(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as err:
        pytest.skip(f"Redis unreachable at {REDIS_URL}: {err}")
    k = StreamKeys(f"cascade:unit:{uuid.uuid4().hex[:8]}")
    try:
        yield k
    finally:
        reset(client, k)
        client.close()


def test_each_message_goes_to_one_consumer_and_ack_clears_it(keys: StreamKeys) -> None:
    client = connect(REDIS_URL)
    a = StreamGroup(client, keys.prompts, "rollout", "a")
    b = StreamGroup(client, keys.prompts, "rollout", "b")
    for i in range(3):
        publish(client, keys.prompts, {"i": i})
    got_a = a.read(count=2, block_ms=100)
    got_b = b.read(count=2, block_ms=100)
    assert [m.data["i"] for m in got_a] == [0, 1] and [m.data["i"] for m in got_b] == [2]
    assert a.pending_count() == 3
    assert a.ack(*(m.id for m in got_a)) == 2
    assert a.read(pending=True) == [] and [m.data for m in b.read(pending=True)] == [{"i": 2}]


def test_a_dead_consumers_pending_message_is_claimed_once_idle(keys: StreamKeys) -> None:
    client = connect(REDIS_URL)
    dead = StreamGroup(client, keys.prompts, "rollout", "dead")
    live = StreamGroup(client, keys.prompts, "rollout", "live")
    publish(client, keys.prompts, {"batch": 7})
    assert len(dead.read(block_ms=100)) == 1  # taken, never acknowledged
    assert live.read(block_ms=50) == []
    assert live.claim_stale(min_idle_ms=60_000) == []  # not idle long enough yet
    time.sleep(0.15)
    claimed = live.claim_stale(min_idle_ms=100)
    assert [m.data for m in claimed] == [{"batch": 7}] and claimed[0].deliveries == 2
    live.ack(claimed[0].id)
    assert live.pending_count() == 0


def test_a_reset_stream_stays_gone_until_the_next_run_makes_it(keys: StreamKeys) -> None:
    """A worker polling a finished run's prefix does not bring its keys back; when a learner
    starts over on the prefix (reset, then it makes the workers' group), the worker joins it."""
    client = connect(REDIS_URL)
    group = StreamGroup(client, keys.prompts, "rollout", "w")
    publish(client, keys.prompts, {"old": True})
    reset(client, keys)
    assert group.read(block_ms=50) == [] and group.claim_stale(min_idle_ms=1) == []
    assert group.read(pending=True) == []
    assert client.exists(*keys.all()) == 0  # the finished run's keys stay removed
    StreamGroup(client, keys.prompts, "rollout", "learner")  # a new learner on this prefix
    publish(client, keys.prompts, {"new": True})
    assert [m.data for m in group.read(block_ms=100)] == [{"new": True}]

"""Redis streams with consumer groups: the distributed mode's data plane.

The learner publishes prompt requests to one stream; rollout workers read them through a
consumer group (XREADGROUP), so each message goes to one worker and stays *pending* until that
worker acknowledges it (XACK) after publishing its scored groups to a second stream. A worker
that dies leaves its messages pending; any live worker takes them over with XAUTOCLAIM once they
have been idle for `claim_idle_ms`. Delivery is at-least-once, so the learner takes each request's
chunk once, by (batch, request index), in its own memory (`services.learner.sources`): nothing
that a Redis restart could lose.

Messages are one JSON object each, in the field `data`.

Redis restarting is an outage of `TRANSIENT` errors (callers retry them through
`cascade.resilience.Dependency`); a Redis restarted without persistence has lost the streams and
their groups: `StreamGroup.resets` counts how often a read found them gone, so the learner knows
to make them again and re-issue what it still waits for.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

DATA = "data"

TRANSIENT: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
"""Redis unreachable, restarting or still loading its data: worth retrying (a `ResponseError`
is a refused command, never retried)."""


@dataclass(frozen=True)
class StreamKeys:
    """The keys one run uses under `prefix` (one learner and its workers share a prefix)."""

    prefix: str

    @property
    def prompts(self) -> str:
        return f"{self.prefix}:prompts"

    @property
    def groups(self) -> str:
        return f"{self.prefix}:groups"

    @property
    def seen(self) -> str:
        """Sample ids an older learner kept here (removed with the run's other keys)."""
        return f"{self.prefix}:seen"

    def all(self) -> list[str]:
        return [self.prompts, self.groups, self.seen]


@dataclass(frozen=True)
class Message:
    id: str
    data: dict[str, Any]
    deliveries: int = 1
    """How many times it has been handed out (2+: redelivered after a consumer died)."""


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30, health_check_interval=10)


class StreamGroup:
    """One stream read through one consumer group, as consumer `consumer`."""

    def __init__(self, client: redis.Redis, stream: str, group: str, consumer: str) -> None:
        self.client = client
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.resets = 0
        """Reads and claims that found the stream or the group gone (deleted, or Redis restarted
        without persistence)."""
        self.ensure_group()

    def ensure_group(self, *, mkstream: bool = True) -> bool:
        """Create the group (and, with `mkstream`, the stream) if missing; it then sees every
        message from the start. False when the stream does not exist (and `mkstream` is off)."""
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=mkstream)
        except redis.ResponseError as err:
            if "BUSYGROUP" in str(err):
                return True
            if not mkstream and _was_reset(err):
                return False
            raise
        return True

    def _after_reset(self) -> bool:
        """The stream or group was deleted under us: a learner starting over on this prefix
        makes them again, a finished run's learner removed them for good. Join the group if it
        is back; never make the stream again ourselves (a finished run's keys stay gone)."""
        return self.ensure_group(mkstream=False)

    def read(self, *, count: int = 1, block_ms: int | None = 1000, pending: bool = False) -> list[Message]:
        """New messages (`pending=False`) or this consumer's own unacknowledged ones (`True`)."""
        try:
            reply = self.client.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: "0" if pending else ">"},
                count=count,
                block=None if pending else block_ms,
            )
        except redis.ResponseError as err:
            if not _was_reset(err):
                raise
            self.resets += 1
            if not self._after_reset() and block_ms:
                time.sleep(block_ms / 1000)  # nothing to block on until the stream is back
            return []
        out: list[Message] = []
        streams: list[Any] = reply or []  # type: ignore[assignment]
        for _, entries in streams:
            for mid, fields in entries:
                if fields:  # a pending entry whose message was deleted comes back empty
                    out.append(Message(mid, _decode(fields), 2 if pending else 1))
        return out

    def claim_stale(self, *, min_idle_ms: int, count: int = 1) -> list[Message]:
        """Take over messages other consumers left pending for at least `min_idle_ms`."""
        try:
            reply = self.client.xautoclaim(
                self.stream, self.group, self.consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
            )
        except redis.ResponseError as err:
            if not _was_reset(err):
                raise
            self.resets += 1
            self._after_reset()
            return []
        entries = reply[1]
        return [Message(mid, _decode(fields), 2) for mid, fields in entries if fields]

    def ack(self, *ids: str) -> int:
        return int(self.client.xack(self.stream, self.group, *ids)) if ids else 0

    def pending_count(self) -> int:
        info = self.client.xpending(self.stream, self.group)
        return int(info["pending"])


def publish(client: redis.Redis, stream: str, data: dict[str, Any], *, maxlen: int = 100_000) -> str:
    """Append one message; the stream is trimmed (approximately) to `maxlen` entries."""
    return str(client.xadd(stream, {DATA: json.dumps(data)}, maxlen=maxlen, approximate=True))


def reset(client: redis.Redis, keys: StreamKeys) -> None:
    """Forget a previous run on these keys (its messages, groups and seen ids)."""
    client.delete(*keys.all())


def _was_reset(err: redis.ResponseError) -> bool:
    """The stream or group was deleted (`reset`) while we used it."""
    text = str(err)
    return (
        "NOGROUP" in text
        or "no longer exists" in text
        or "no such key" in text
        or "requires the key to exist" in text
    )


def _decode(fields: dict[str, str]) -> dict[str, Any]:
    value = json.loads(fields[DATA])
    if not isinstance(value, dict):
        raise ValueError(f"stream message is not a JSON object: {fields[DATA][:80]!r}")
    return value

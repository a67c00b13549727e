"""Several rollout replicas behind one name: where they are, and generation that is never stale.

Addresses come from a list (`host:port,host:port`) and/or a DNS name (`name:port`, e.g. a
headless Kubernetes Service) resolved with `getaddrinfo` to every address it lists, again at
each `Addresses.current()`.

The version rule, shared by the learner and the rollout workers: every replica counts its
weights' versions in the same numbers (the learner pushes version `v + offset` to all of them,
one `offset` for the run), so a request names ONE expected version, valid on any replica. A reply
made by older weights than the request expects is never used: `ReplicaPool.generate` tries
another replica (or waits) instead, so no chunk is labelled with a version its weights were not.
A newer version than expected is fine (fresher weights; the learner's staleness check uses the
version the reply reports).

The rounds of a multi-turn rollout (`SamplingSettings.turn`) go to the replica that served the
rollout's previous round while it can serve (`TurnRoutes`): that replica holds the keys/values
the round reuses (`cascade.engine.prefix_kv`); another one would prefill the whole context.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.transport.rollout_client import RolloutClient

log = logging.getLogger("cascade.rollout.replicas")

# An RPC answered with these codes says the *request* is wrong: another replica would refuse it too.
REQUEST_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)


class NoReplicaReady(RuntimeError):
    """No replica could serve the request with weights at least as new as expected (yet)."""


def split_addresses(text: str | None) -> list[str]:
    """`"a:1, b:2"` -> `["a:1", "b:2"]` (order kept, duplicates dropped); every item needs a port."""
    out: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        _host_port(item, "rollout address")
        if item not in out:
            out.append(item)
    return out


def _host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{what} {text!r}: expected host:port")
    return host, int(port)


def resolve(name_port: str) -> list[str]:
    """Every address a DNS name lists (a headless Service: one per ready pod), as `ip:port`,
    sorted; none when the name does not resolve (yet)."""
    host, port = _host_port(name_port, "rollout DNS name")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    found = set()
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        found.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    return sorted(found)


@dataclass
class Addresses:
    """The replicas' addresses: a fixed list plus what `dns` resolves to now."""

    static: list[str] = field(default_factory=list)
    dns: str | None = None
    resolver: Callable[[str], list[str]] = resolve

    @classmethod
    def parse(cls, rollout: str | None, dns: str | None = None) -> Addresses:
        out = cls(split_addresses(rollout), dns or None)
        if not out.static and not out.dns:
            raise ValueError("no rollout address: give --rollout host:port[,host:port] or --rollout-dns")
        if out.dns:
            _host_port(out.dns, "rollout DNS name")
        return out

    def current(self) -> list[str]:
        found = list(self.static)
        if self.dns:
            found += [a for a in self.resolver(self.dns) if a not in found]
        return found

    def describe(self) -> str:
        parts = list(self.static) + ([f"dns {self.dns}"] if self.dns else [])
        return ", ".join(parts)


class TurnRoutes:
    """The replica that served each multi-turn rollout's last round (the latest `size`)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._routes: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def preferred(self, sampling: SamplingSettings) -> str | None:
        turn = sampling.turn
        if turn is None or turn.round == 0:
            return None
        with self._lock:
            return self._routes.get((turn.caller, turn.rollout))

    def served(self, sampling: SamplingSettings, address: str) -> None:
        turn = sampling.turn
        if turn is None:
            return
        with self._lock:
            key = (turn.caller, turn.rollout)
            self._routes.pop(key, None)
            self._routes[key] = address
            while len(self._routes) > self.size:
                self._routes.popitem(last=False)


def first(order: Sequence[str], preferred: str | None) -> list[str]:
    """`order` with `preferred` first when it is in it."""
    if preferred is None or preferred not in order:
        return list(order)
    return [preferred, *(a for a in order if a != preferred)]


@dataclass
class _Replica:
    client: RolloutClient
    down_until: float = 0.0
    behind: int | None = None  # the last version seen when it was older than asked for


class ReplicaPool:
    """A rollout worker's replicas: requests spread round-robin, each answered only by weights at
    least as new as the request expects.

    A replica that fails (unreachable, deadline) rests `down_s` seconds; one that answered with
    older weights is asked for its version (`GetModelInfo`, cheap) before it is given another
    request that expects more. When no replica can serve, `generate` waits up to `wait_s` (the
    learner may be pushing) and raises `NoReplicaReady`: the worker keeps the request pending and
    retries it.
    """

    def __init__(
        self,
        addresses: Addresses,
        *,
        client: Callable[[str], RolloutClient] = RolloutClient,
        down_s: float = 5.0,
        wait_s: float = 10.0,
        refresh_s: float = 30.0,
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.addresses = addresses
        self._make_client = client
        self.down_s, self.wait_s, self.refresh_s, self.poll_s = down_s, wait_s, refresh_s, poll_s
        self.clock, self.sleep = clock, sleep
        self.replicas: dict[str, _Replica] = {}
        self._next = 0
        self._refreshed = -float("inf")
        self.last_address = ""
        self.stale_replies = 0
        self.routes = TurnRoutes()

    def _refresh(self, force: bool = False) -> list[str]:
        now = self.clock()
        if force or now - self._refreshed >= self.refresh_s or not self.replicas:
            self._refreshed = now
            current = self.addresses.current()
            for gone in [a for a in self.replicas if a not in current]:
                self.replicas.pop(gone).client.close()
                log.info("rollout replica %s is no longer listed", gone)
            for address in current:
                if address not in self.replicas:
                    self.replicas[address] = _Replica(self._make_client(address))
        return list(self.replicas)

    def _order(self, addresses: Sequence[str]) -> list[str]:
        if not addresses:
            return []
        start = self._next % len(addresses)
        self._next += 1
        return [*addresses[start:], *addresses[:start]]

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingSettings, *, min_version: int
    ) -> VersionedGeneration:
        deadline = self.clock() + self.wait_s
        while True:
            for address in first(self._order(self._refresh()), self.routes.preferred(sampling)):
                result = self._try(address, prompts, n, sampling, min_version)
                if result is not None:
                    self.last_address = address
                    self.routes.served(sampling, address)
                    return result
            if self.clock() >= deadline:
                raise NoReplicaReady(
                    f"no rollout replica ({self.addresses.describe()}) serves version {min_version} "
                    f"or newer: {self._states(min_version)}"
                )
            self.sleep(self.poll_s)
            self._refresh(force=True)

    def _try(
        self, address: str, prompts: list[list[int]], n: int, sampling: SamplingSettings, min_version: int
    ) -> VersionedGeneration | None:
        r = self.replicas[address]
        if r.down_until > self.clock():
            return None
        try:
            if r.behind is not None and r.behind < min_version:
                r.behind = r.client.model_info()[1]  # cheap: is it still behind?
                if r.behind < min_version:
                    return None
            result = r.client.generate(prompts, group_size=n, sampling=sampling).result
        except grpc.RpcError as err:
            if err.code() in REQUEST_ERRORS:
                raise
            r.down_until = self.clock() + self.down_s
            log.warning("rollout replica %s failed (%s); trying another", address, err.code())
            return None
        if result.version < min_version:
            r.behind = result.version
            self.stale_replies += 1
            log.warning(
                "rollout replica %s answered with version %d, the request expects %d: not used, "
                "trying another",
                address,
                result.version,
                min_version,
            )
            return None
        r.behind = None
        return result

    def _states(self, min_version: int) -> str:
        now = self.clock()
        parts = []
        for address, r in self.replicas.items():
            if r.down_until > now:
                parts.append(f"{address} unreachable")
            elif r.behind is not None and r.behind < min_version:
                parts.append(f"{address} at version {r.behind}")
            else:
                parts.append(f"{address} ok")
        return ", ".join(parts) or "none listed"

    def close(self) -> None:
        for r in self.replicas.values():
            r.client.close()
        self.replicas.clear()

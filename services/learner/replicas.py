"""The learner's rollout replicas: new weights to every one at once, unscored generation to one
that holds them.

Versions. Every engine's version only grows (`cascade.engine.base.next_version` refuses an update
that is not above the current one: a late update can never roll a replica back, and a reply's
version always orders its weights). The learner's own version does not: a resumed learner goes
back to its checkpoint's version, a fresh one starts at 0 against replicas that served an earlier
run. So the learner cannot push its version as is; it pushes `learner version + offset`, with ONE
offset for all replicas, chosen at `attach` above every replica's current version
(`max(current) + 1 - learner version`). All replicas then count alike: a request names one
expected engine version whichever replica serves it (`PromptRequest.policy_version`), and a chunk's
engine version maps back to the learner's by subtracting the same offset (so `max_staleness` is
checked in learner versions, as in one process).

Failures. A push goes to every replica in threads; the step continues when every replica has
answered. A replica that fails (unreachable, deadline, update refused) is taken out of service:
logged, counted (`on_failure`; the step's `replica_failures`, `replicas_out`) and neither pushed
to nor asked until it answers again: at every push, and every few seconds while the learner waits
for rollouts (`heal`), each replica out of service is probed (`GetModelInfo`, quick) and one that
answers is given the current weights and version BEFORE it is back in service (a restarted
process on the same address, a pod the DNS name lists again). A replica in service that reports
older weights than it was given (restarted between two probes) is given them again. A replica
out of service may still hold old weights; the workers' per-request version check
(`cascade.transport.rollout_replicas`) keeps it from serving a request that expects newer ones.

No replica in service is an outage of the `rollout` dependency (`cascade.resilience`): pushes and
generation are retried, out replicas probed, until one is back or the outage passes
`resilience.rollout_s` (`DependencyDown`). One replica down of several is no outage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.resilience import Dependency
from cascade.transport.rollout_client import RolloutClient
from cascade.transport.rollout_replicas import REQUEST_ERRORS, Addresses, TurnRoutes


class NoReplicaLeft(ConnectionError):
    """Every rollout replica is out of service (the `rollout` dependency's outage)."""


def _why(err: BaseException) -> str:
    if isinstance(err, grpc.RpcError):
        details = err.details() if hasattr(err, "details") else ""
        return f"{err.code().name}: {details}"[:300]
    return f"{type(err).__name__}: {err}"[:300]


class RolloutReplicas:
    def __init__(
        self,
        addresses: Addresses,
        *,
        log: Callable[[str], None] = print,
        on_failure: Callable[[str, str], None] | None = None,
        client: Callable[[str], RolloutClient] = RolloutClient,
        wait_s: float = 60.0,
        poll_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        outage: Dependency | None = None,
        probe_timeout_s: float = 5.0,
    ) -> None:
        """`outage`: the `rollout` dependency that bounds how long no replica may be in service
        (default: no wait at all)."""
        self.addresses = addresses
        self.log = log
        self.on_failure = on_failure
        self._make_client = client
        self.wait_s, self.poll_s, self.sleep = wait_s, poll_s, sleep
        self.offset = 0
        self.version = -1  # the engine version every replica in service holds
        self.active: dict[str, RolloutClient] = {}
        self.out: dict[str, str] = {}  # address -> why it was taken out
        self.outage = outage or Dependency(
            "rollout", give_up_after_s=0.0, transient=(NoReplicaLeft,), log=log, sleep=sleep
        )
        self.probe_timeout_s = probe_timeout_s
        self.readmitted = 0
        """Replicas put back in service after they answered again (each given the weights first)."""
        self._latest: str | None = None  # the checkpoint of `version`, for a replica re-admitted
        self._next = 0
        self.routes = TurnRoutes()
        self._failures = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ life cycle

    def attach(self, learner_version: int) -> None:
        """Find the replicas (waiting up to `wait_s` for every listed one to answer, at least one
        for a DNS name that lists none yet) and choose the offset above all their versions."""
        deadline = time.monotonic() + self.wait_s
        versions: dict[str, int] = {}
        while True:
            missing = []
            for address in self.addresses.current():
                if address in versions:
                    continue
                client = self.active.get(address) or self._make_client(address)
                self.active[address] = client
                try:
                    versions[address] = client.model_info()[1]
                except grpc.RpcError as err:
                    missing.append((address, _why(err)))
            if versions and not missing or time.monotonic() >= deadline:
                break
            self.sleep(self.poll_s)
        for address, why in missing:
            self._take_out(address, f"not reachable at start ({why})", during="attach")
        if not versions:
            where = self.addresses.describe()
            raise NoReplicaLeft(f"no rollout replica answered within {self.wait_s:.0f}s ({where})")
        for address in [a for a in self.active if a not in versions]:
            self.active.pop(address).close()
        self.offset = max(versions.values()) + 1 - learner_version
        self.log(
            f"rollout replicas: {', '.join(sorted(versions))} (engine versions "
            f"{', '.join(str(versions[a]) for a in sorted(versions))}; learner version v is pushed "
            f"as v + {self.offset})"
        )

    def close(self) -> None:
        for client in self.active.values():
            client.close()
        self.active.clear()

    # ------------------------------------------------------------------ weights

    def push(self, path: str, learner_version: int) -> dict[str, float]:
        """`path`'s weights as `learner_version` on every replica in service, on any the DNS name
        newly lists and on any out of service that answers again; returns when every one has
        answered. None in service: retried within the `rollout` outage's bound."""
        return self.outage.call(lambda: self._push(path, learner_version))

    def _push(self, path: str, learner_version: int) -> dict[str, float]:
        version = learner_version + self.offset
        with self._lock:
            self.version, self._latest = version, path
            listed = self._listed_now()
            targets = dict(self.active)
            returning = [a for a in listed if a in self.out]
            for address in listed:
                if address not in targets and address not in self.out:
                    targets[address] = self._make_client(address)
                    self.log(f"  rollout replica {address} found: pushing the current weights")
        t0 = time.perf_counter()
        failed: dict[str, str] = {}
        seconds: list[float] = []

        def one(address: str, client: RolloutClient) -> None:
            start = time.perf_counter()
            try:
                client.update_weights(path, version=version)
            except Exception as err:  # noqa: BLE001 - any failure takes the replica out
                failed[address] = _why(err)
            else:
                seconds.append(time.perf_counter() - start)

        workers = len(targets) + len(returning) + 1
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="push") as pool:
            for address, client in targets.items():
                pool.submit(one, address, client)
            for address in returning:
                pool.submit(self._readmit, address, path, version)
        with self._lock:
            for address, client in targets.items():
                if address in failed:
                    self.active.pop(address, None)
                    client.close()
                    why = f"weight update v{learner_version} failed: {failed[address]}"
                    self._take_out(address, why, "push")
                else:
                    self.active[address] = client
            failures, self._failures = self._failures, 0
        if not self.active:
            self._failures = failures
            raise NoReplicaLeft(f"no rollout replica holds version {learner_version}: {self._out_text()}")
        return {
            "time_push_s": time.perf_counter() - t0,
            "time_push_replica_max_s": max(seconds, default=0.0),
            "rollout_replicas": float(len(self.active)),
            "replicas_out": float(len(self.out)),
            "replica_failures": float(failures),
        }

    def _readmit(self, address: str, path: str, version: int) -> bool:
        """Probe a replica out of service; one that answers gets `path` as `version` and is back
        in service. One that still fails stays out, quietly (it was logged when it went out)."""
        client = self._make_client(address)  # a fresh channel: the old one may sit in backoff
        try:
            before = client.model_info(timeout_s=self.probe_timeout_s)[1]
            client.update_weights(path, version=version)
        except Exception:  # noqa: BLE001 - still out (logged when it went out)
            client.close()
            return False
        with self._lock:
            if address not in self.out or self.version != version:
                client.close()  # listed no more, or a newer push went out meanwhile: next time
                return False
            del self.out[address]
            self.active[address] = client
            self.readmitted += 1
        self.log(
            f"  rollout replica {address} answers again (it held engine version {before}): given "
            f"version {version - self.offset}, back in service"
        )
        return True

    def heal(self) -> None:
        """While the learner waits for rollouts (no push for a while): a replica in service that
        holds older weights than it was given (restarted) is given them again, one that does not
        answer is taken out; replicas out of service that answer again are re-admitted. None in
        service is the `rollout` outage (`DependencyDown` past its bound)."""
        with self._lock:
            if self._latest is None:
                return
            path, version = self._latest, self.version
            listed = self._listed_now()
            active = dict(self.active)
        for address, client in active.items():
            try:
                held = client.model_info(timeout_s=self.probe_timeout_s)[1]
                if held < version:
                    client.update_weights(path, version=version)
                    self.log(
                        f"  rollout replica {address} held engine version {held} (restarted?): "
                        f"given version {version - self.offset} again"
                    )
            except Exception as err:  # noqa: BLE001 - any other failure takes the replica out
                if isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue  # busy, not gone: a push or a generation will tell
                with self._lock:
                    if self.active.pop(address, None) is not None:
                        client.close()
                        self._take_out(address, f"probe failed: {_why(err)}", "probe")
        for address in listed:
            if address not in active and address in self.out:
                self._readmit(address, path, version)
        if self.active:
            self.outage.succeeded()
        else:
            self.outage.failed(NoReplicaLeft(f"no rollout replica in service: {self._out_text()}"))

    def _listed_now(self) -> list[str]:
        """What the addresses list now; an out replica that left the list may come back later."""
        try:
            listed = self.addresses.current()
        except OSError as err:
            self.log(f"  resolving the rollout replicas failed ({err}); keeping the known ones")
            return list(self.active)
        for address in [a for a in self.out if a not in listed]:
            del self.out[address]  # gone (a restarted pod); if it is listed again, it may rejoin
        for address in [a for a in self.active if a not in listed]:
            self.active.pop(address).close()
            self.log(f"  rollout replica {address} is no longer listed: not pushed to any more")
        return listed

    def _take_out(self, address: str, why: str, during: str) -> None:
        self.out[address] = why
        self._failures += 1
        self.log(f"  ERROR rollout replica {address} taken out of service: {why}")
        if self.on_failure is not None:
            self.on_failure(address, during)

    def _out_text(self) -> str:
        return "; ".join(f"{a}: {why}" for a, why in self.out.items()) or "none listed"

    # ------------------------------------------------------------------ unscored generation

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        """From a replica in service (round-robin; a multi-turn rollout's later rounds from the
        replica that served its previous round, which holds its keys/values, while it is in
        service); one that fails or answers with older weights than the last push is taken out
        and the next one asked. None in service: replicas out are probed and re-admitted, within
        the `rollout` outage's bound. The version is the engine's."""
        return self.outage.call(lambda: self._generate(prompts, n, sampling))

    def _generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        while True:
            with self._lock:
                empty, latest, version = not self.active, self._latest, self.version
            if empty and latest is not None:
                for address in list(self.out):
                    self._readmit(address, latest, version)
            with self._lock:
                if not self.active:
                    raise NoReplicaLeft(f"no rollout replica in service: {self._out_text()}")
                address = self.routes.preferred(sampling) or ""
                if address not in self.active:  # round-robin, but a rollout's rounds stay together
                    names = sorted(self.active)
                    address = names[self._next % len(names)]
                    self._next += 1
                client = self.active[address]
            try:
                result = client.generate(prompts, group_size=n, sampling=sampling).result
            except grpc.RpcError as err:
                if err.code() in REQUEST_ERRORS:
                    raise
                why = f"generation failed: {_why(err)}"
            else:
                if result.version >= self.version:
                    self.routes.served(sampling, address)
                    return result
                why = f"answered with version {result.version}, it was given {self.version}"
            with self._lock:
                if self.active.pop(address, None) is not None:
                    client.close()
                    self._take_out(address, why, "generate")

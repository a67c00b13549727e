"""`python -m services.rollout.worker`: a rollout worker of the distributed mode.

Reads prompt requests from the run's Redis stream through the consumer group `rollout`, turns each
into a scored chunk with `cascade.rollout.scoring.generate_and_score` (the embedded run's own rollout
function) with the rollout replicas generating (gRPC Generate, seeded per request, spread
round-robin over `--rollout a,b` / `--rollout-dns`; a reply made by older weights than the
request's `policy_version` is never used: another replica is asked, or the request waits) and the
reward service scoring (gRPC Score), publishes the chunk to the groups stream, and only then
acknowledges the request. Before reading new requests it retries its own pending ones
and takes over requests other workers left pending for `--claim-idle-ms` (a worker that died
mid-batch). Holds no model: only the tokenizer, to turn completion tokens into text.

Redis restarting is an outage (`cascade.resilience`) logged once each way: reads, publishes and
acknowledgements are retried for up to `--redis-wait-s`, then the worker exits (code 75). A
Redis that lost the streams (no persistence) has them made again by the learner, which
re-issues the requests; the worker joins the new group as soon as it exists.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("cascade.rollout.worker")
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cascade-rollout-worker", description=__doc__.splitlines()[0])
    p.add_argument(  # from the environment, a password stays off the command line (`ps` shows it)
        "--redis-url",
        default=os.environ.get("CASCADE_WORKER_REDIS_URL") or DEFAULT_REDIS_URL,
        help=f"env CASCADE_WORKER_REDIS_URL; default: {DEFAULT_REDIS_URL}",
    )
    p.add_argument("--stream-prefix", required=True, help="the run's key prefix (as the learner's)")
    p.add_argument("--rollout", help="rollout replica addresses host:port[,host:port...]")
    p.add_argument(
        "--rollout-dns", help="NAME:PORT of a headless service listing the replicas (re-resolved every 30 s)"
    )
    p.add_argument("--reward", required=True, help="reward service address host:port")
    p.add_argument("--tokenizer", required=True, type=Path, help="model directory holding the tokenizer")
    p.add_argument("--name", default=None, help="consumer name (default: <host>-<pid>)")
    p.add_argument(
        "--claim-idle-ms",
        type=int,
        default=30_000,
        help="take over requests pending this long at a dead worker (default: %(default)s)",
    )
    p.add_argument("--block-ms", type=int, default=500, help="wait for new requests (default: %(default)s)")
    p.add_argument(
        "--redis-wait-s",
        type=float,
        default=300.0,
        help="ride out a Redis outage this long, then exit (default: %(default)s, as resilience.redis_s)",
    )
    p.add_argument(
        "--fault-hold-s",
        type=float,
        default=0.0,
        help="fault-injection tests only: sleep this long with the first request taken, at --fault-at",
    )
    p.add_argument("--fault-at", choices=["before_generate", "before_ack"], default="before_generate")
    p.add_argument(
        "--health-file",
        type=Path,
        default=None,
        help="touched each time the worker reads its requests or finishes one (a container's health "
        "check: deploy/docker/healthcheck.py file PATH --max-age-s S)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = p.parse_args(argv)
    if not args.tokenizer.is_dir():
        p.error(f"--tokenizer: {args.tokenizer} is not a directory")
    from cascade.transport.rollout_replicas import Addresses

    try:
        Addresses.parse(args.rollout, args.rollout_dns)
    except ValueError as err:
        p.error(str(err))
    if args.claim_idle_ms < 1:
        p.error("--claim-idle-ms must be positive")
    if args.redis_wait_s < 0:
        p.error("--redis-wait-s must be >= 0")
    args.name = args.name or f"{socket.gethostname()}-{os.getpid()}"
    return args


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        from cascade.model.loading import load_tokenizer
        from cascade.resilience import Dependency
        from cascade.transport.redis_streams import TRANSIENT, StreamGroup, StreamKeys, connect
        from cascade.transport.reward_client import RewardClient
        from cascade.transport.rollout_replicas import Addresses, ReplicaPool

        self.args = args
        self.keys = StreamKeys(args.stream_prefix)
        self.redis = connect(args.redis_url)
        self.redis_outage = Dependency(
            "redis", give_up_after_s=args.redis_wait_s, transient=TRANSIENT, log=log.warning
        )
        self.requests = self.redis_outage.call(
            lambda: StreamGroup(self.redis, self.keys.prompts, "rollout", args.name)
        )
        self.rollout = ReplicaPool(Addresses.parse(args.rollout, args.rollout_dns))
        self.reward = RewardClient(args.reward)
        self.tokenizer = load_tokenizer(args.tokenizer)
        self.stopping = False
        self.faulted = False

    def run(self) -> None:
        """Until stopped; `DependencyDown` when Redis stays away past `--redis-wait-s`."""
        from cascade.resilience import DependencyDown
        from cascade.transport.rollout_replicas import NoReplicaReady

        log.info("worker %s consuming %s", self.args.name, self.keys.prompts)
        while not self.stopping:
            try:
                messages = self.redis_outage.call(self.next_messages)
                self.alive()
            except DependencyDown:
                raise
            except Exception:  # a refused command: try again shortly
                log.exception("reading requests failed; retrying")
                time.sleep(1.0)
                continue
            for message in messages:
                try:
                    self.handle(message.id, message.data)
                    self.alive()
                except DependencyDown:
                    raise
                except NoReplicaReady as err:  # replicas restarting or behind: the request waits
                    log.warning("request %s waits: %s", message.id, err)
                    time.sleep(1.0)
                except Exception:  # the request stays pending: retried next loop
                    log.exception("request %s failed; retrying", message.id)
                    time.sleep(1.0)

    def alive(self) -> None:
        """Touch `--health-file`: the worker reached Redis just now (or finished a request)."""
        if self.args.health_file is not None:
            try:
                self.args.health_file.touch()
            except OSError as err:
                log.warning("cannot touch the health file %s: %s", self.args.health_file, err)

    def next_messages(self) -> list[Any]:
        """Own pending requests first (a failed attempt), then ones a dead worker left, then new."""
        messages = self.requests.read(pending=True, count=1)
        if not messages:
            messages = self.requests.claim_stale(min_idle_ms=self.args.claim_idle_ms, count=1)
            if messages:
                log.info("claimed %s left pending by another worker", messages[0].id)
        if not messages:
            messages = self.requests.read(count=1, block_ms=self.args.block_ms)
        return messages

    def _fault(self, where: str) -> None:
        if self.args.fault_hold_s > 0 and not self.faulted and self.args.fault_at == where:
            self.faulted = True
            log.info("fault hold %s (%.1fs)", where, self.args.fault_hold_s)
            time.sleep(self.args.fault_hold_s)

    def handle(self, message_id: str, data: dict[str, Any]) -> None:
        from cascade.domains.base import Problem, RewardVerdict
        from cascade.engine.base import SamplingSettings, VersionedGeneration
        from cascade.model.chat import completion_decoder, token_encoder
        from cascade.rollout.requests import PromptRequest
        from cascade.rollout.scoring import generate_and_score
        from cascade.transport.redis_streams import publish

        req = PromptRequest.from_json(data)
        log.info("took %s: batch %d request %d", message_id, req.batch, req.index)
        self._fault("before_generate")

        served: list[str] = []

        def generate_fn(prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
            result = self.rollout.generate(prompts, n, sampling, min_version=req.policy_version)
            served.append(self.rollout.last_address)
            return result

        def decode(ids: list[list[int]]) -> list[str]:
            return completion_decoder(self.tokenizer)(ids)

        def encode(text: str, literal: bool) -> list[int]:
            return token_encoder(self.tokenizer)(text, literal)

        def score(
            domain: str, problems: list[Problem], texts: list[str], reward_config: dict[str, Any] | None
        ) -> list[RewardVerdict]:
            return self.reward.score(domain, problems, texts, reward_config=reward_config)

        chunk = generate_and_score(
            req,
            generate_fn=generate_fn,
            decode=decode,
            score=score,
            worker=self.args.name,
            encode=encode,
        )
        self.redis_outage.call(lambda: publish(self.redis, self.keys.groups, chunk.to_json()))
        self._fault("before_ack")
        self.redis_outage.call(lambda: self.requests.ack(message_id))
        log.info(
            "published batch %d request %d (engine v%d, replica %s)",
            req.batch,
            req.index,
            chunk.engine_version,
            ", ".join(served) or "-",
        )

    def close(self) -> None:
        self.rollout.close()
        self.reward.close()
        self.redis.close()


EXIT_DEPENDENCY_DOWN = 75
"""EX_TEMPFAIL: Redis stayed away past `--redis-wait-s` (a supervisor may start the worker again)."""


def main(argv: list[str] | None = None) -> int:
    from cascade.resilience import DependencyDown

    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        worker = Worker(args)
    except DependencyDown as err:
        log.error("worker stopped: %s", err)
        return EXIT_DEPENDENCY_DOWN

    parent = os.getppid()

    def on_signal(signum: int, frame: Any) -> None:
        if os.getppid() != parent:  # the parent-death signal: what it waits on is likely gone too
            log.info("signal %d: the parent is gone; stopping now (its request goes back)", signum)
            os._exit(128 + signum)
        log.info("signal %d: stopping after the current request", signum)
        worker.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        worker.run()
    except DependencyDown as err:
        log.error("worker stopped: %s", err)
        return EXIT_DEPENDENCY_DOWN
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

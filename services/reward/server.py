"""The gRPC transport of the reward service: request in, `Dispatcher` call, verdicts out.

A bad request is answered INVALID_ARGUMENT with `requests.BadRequest`'s message; nothing a
client sends can crash the server. Verifier and worker failures are not RPC errors: they come
back as `infra_error` verdicts (see `scoring`), each logged with its cause. A well-formed
request is always answered with one verdict per item: an item whose scoring fails in an
unexpected way gets an `infra_error`, and its neighbours keep theirs. Verdict text is
encodable by construction (`RewardVerdict` sanitises it), and a verdict protobuf refuses all
the same becomes an `infra_error` of its own instead of failing the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import grpc

from cascade.domains import RewardVerdict
from cascade.domains.base import INFRA_ERROR, OUTPUT_LIMIT
from cascade.domains.length_bound import OVER_LONG
from cascade_proto.v1 import reward_pb2, reward_pb2_grpc
from services.reward.batch import Batch, infra_verdicts
from services.reward.local import DEADLINE_PASSED
from services.reward.metrics import RewardMetrics
from services.reward.requests import DOMAINS, BadRequest, parse_request
from services.reward.scoring import Dispatcher

log = logging.getLogger(__name__)

SERVICE_NAME = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(
        self,
        dispatcher: Dispatcher,
        metrics: RewardMetrics,
        *,
        max_items: int = 4096,
        python_functions: frozenset[str] = frozenset(),
        python_path: tuple[str, ...] = (),
    ) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.max_items = max_items
        self.python_functions = python_functions
        self.python_path = python_path

    def Score(  # noqa: N802 - gRPC method name
        self, request: reward_pb2.ScoreRequest, context: grpc.ServicerContext
    ) -> reward_pb2.ScoreResponse:
        with _Call(self.metrics, "Score", request.domain) as call:
            batch = call.parse(request, context, self.max_items, self.python_functions, self.python_path)
            wait_s = _wait_s(context)
            try:
                verdicts = self.dispatcher.score(batch, is_active=context.is_active, timeout_s=wait_s)
            except Exception as err:  # a bug of ours: every item is unscored, the RPC still answers
                log.exception("scoring a %s batch of %d items failed", batch.domain.name, len(batch.problems))
                verdicts = infra_verdicts(len(batch.problems), f"reward service error: {err!r:.300}")
            call.count(verdicts)
            return reward_pb2.ScoreResponse(
                verdicts=[_verdict(i, batch.problems[i].id, v) for i, v in enumerate(verdicts)]
            )

    def ScoreStream(  # noqa: N802 - gRPC method name
        self, request: reward_pb2.ScoreRequest, context: grpc.ServicerContext
    ) -> Iterator[reward_pb2.Verdict]:
        with _Call(self.metrics, "ScoreStream", request.domain) as call:
            batch = call.parse(request, context, self.max_items, self.python_functions, self.python_path)
            wait_s = _wait_s(context)
            sent: set[int] = set()
            try:
                stream = self.dispatcher.stream(batch, is_active=context.is_active, timeout_s=wait_s)
                for i, verdict in stream:
                    call.count([verdict])
                    sent.add(i)
                    yield _verdict(i, batch.problems[i].id, verdict)
            except Exception as err:  # a bug of ours: the items not yet sent are unscored
                log.exception("streaming a %s batch failed after %d items", batch.domain.name, len(sent))
                (failed,) = infra_verdicts(1, f"reward service error: {err!r:.300}")
                for i in range(len(batch.problems)):
                    if i not in sent:
                        call.count([failed])
                        yield _verdict(i, batch.problems[i].id, failed)


class _Call:
    """One RPC's metrics: in-flight, latency and outcome, and the request's validation."""

    def __init__(self, metrics: RewardMetrics, method: str, domain: str) -> None:
        self.metrics = metrics
        self.method = method
        self.domain = domain if domain in DOMAINS else "unknown"
        self.code = grpc.StatusCode.OK

    def __enter__(self) -> _Call:
        self.start = time.perf_counter()
        self.metrics.in_flight.labels(self.method).inc()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.metrics.in_flight.labels(self.method).dec()
        if isinstance(exc, GeneratorExit):  # a stream whose client went away
            self.code = grpc.StatusCode.CANCELLED
        elif exc is not None and self.code == grpc.StatusCode.OK:
            self.code = grpc.StatusCode.INTERNAL
            log.error("%s failed", self.method, exc_info=exc)
        self.metrics.requests.labels(self.method, self.domain, self.code.name).inc()
        self.metrics.latency.labels(self.method, self.domain).observe(time.perf_counter() - self.start)

    def parse(
        self,
        request: reward_pb2.ScoreRequest,
        context: grpc.ServicerContext,
        max_items: int,
        python_functions: frozenset[str],
        python_path: tuple[str, ...],
    ) -> Batch:
        try:
            batch = parse_request(
                request, max_items=max_items, python_functions=python_functions, python_path=python_path
            )
            self.domain = batch.domain.kind  # metric labels by verifier kind: a bounded set
            return batch
        except BadRequest as err:
            self.code = grpc.StatusCode.INVALID_ARGUMENT
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise AssertionError("context.abort raises") from None

    def count(self, verdicts: list[RewardVerdict]) -> None:
        for v in verdicts:
            self.metrics.items.labels(self.domain, v.reason).inc()
            if v.reason == OUTPUT_LIMIT and v.detail.startswith(OVER_LONG):
                self.metrics.over_long.labels(self.domain).inc()
            elif v.is_infra_error and v.detail.startswith(DEADLINE_PASSED):
                self.metrics.deadline_expired.labels(self.domain).inc()


def _wait_s(context: grpc.ServicerContext) -> float | None:
    """How long scoring may take so that `infra_error` verdicts still beat the client's deadline."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return max(0.05, remaining - min(1.0, 0.2 * remaining))


def _verdict(index: int, problem_id: str, v: RewardVerdict) -> reward_pb2.Verdict:
    try:
        return reward_pb2.Verdict(
            index=index, problem_id=problem_id, reward=v.reward, reason=v.reason, detail=v.detail
        )
    except Exception as err:  # RewardVerdict's text is encodable; this guards the guard
        log.error("verdict %d (%s) cannot be encoded: %r", index, problem_id, err)
        return reward_pb2.Verdict(
            index=index,
            problem_id=problem_id,
            reward=0.0,
            reason=INFRA_ERROR,
            detail=f"verdict could not be encoded: {type(err).__name__}",
        )

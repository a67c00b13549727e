"""The gRPC transport of the rollout service: request in, `Engine` call, response out.

Bad requests (empty prompt, group size 0, token ids outside the vocabulary, a budget over the
context, ...) and refused weight updates are answered INVALID_ARGUMENT with a message; the
engine is untouched and keeps serving.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
from transformers import PreTrainedTokenizerBase

from cascade.config import ChatConfig
from cascade.engine.base import Engine, EngineRequestError, WeightUpdate, WeightUpdateError
from cascade.engine.prefix_kv import TurnKV
from cascade.transport.grpc_server import RpcCall
from cascade_proto.v1 import rollout_pb2 as pb
from cascade_proto.v1 import rollout_pb2_grpc as pb_grpc
from services.rollout.metrics import RolloutMetrics
from services.rollout.requests import BadRequest, Limits, assemble_stream, parse_generate

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RolloutService"].full_name
FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
INVALID = (BadRequest, EngineRequestError, WeightUpdateError)


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        metrics: RolloutMetrics,
        *,
        chat: ChatConfig | None = None,
        limits: Limits | None = None,
        max_concurrent: int = 4,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.chat = chat or ChatConfig()
        self.limits = limits or Limits()
        self._slots = threading.BoundedSemaphore(max_concurrent)
        metrics.policy_version.set(engine.version)
        turns = getattr(engine, "turns", None)
        if isinstance(turns, TurnKV):
            turns.listeners.append(
                lambda reused: metrics.turn_rounds.labels("reused" if reused else "full").inc()
            )
            metrics.turn_kv_bytes.set_function(lambda: turns.nbytes)

    def _call(self, context: grpc.ServicerContext, method: str) -> RpcCall:
        return RpcCall(context, self.metrics, method, invalid=INVALID)

    def Generate(  # noqa: N802 - gRPC method name
        self, request: pb.GenerateRequest, context: grpc.ServicerContext
    ) -> pb.GenerateResponse:
        with self._call(context, "Generate"):
            call = parse_generate(request, self.tokenizer, self.chat, self.limits)
            with self._slots:
                out = self.engine.generate(call.prompt_ids, call.n, call.sampling)
            gen = out.generation
            reply = pb.GenerateResponse(policy_version=out.version)
            for i, prompt in enumerate(call.prompt_ids):
                group = reply.groups.add(prompt_ids=prompt)
                for row in range(i * out.n, (i + 1) * out.n):
                    group.completions.add(
                        token_ids=gen.completion_ids[row],
                        logprobs=gen.logprobs[row],
                        finish_reason=FINISH[gen.finish_reasons[row]],
                    )
                    self.metrics.sequences.labels(gen.finish_reasons[row]).inc()
            self.metrics.tokens.inc(sum(len(c) for c in gen.completion_ids))
            return reply

    def UpdateWeights(  # noqa: N802 - gRPC method name
        self, request: pb.UpdateWeightsRequest, context: grpc.ServicerContext
    ) -> pb.UpdateWeightsResponse:
        with self._call(context, "UpdateWeights"):
            if not request.checkpoint_path:
                raise BadRequest("checkpoint_path: empty")
            version = request.version if request.HasField("version") else None
            with self._refusals("checkpoint"):
                update = self.engine.load_checkpoint(request.checkpoint_path, version)
            return self._accepted(update, "checkpoint")

    def UpdateWeightsStream(  # noqa: N802 - gRPC method name
        self, request_iterator: Iterator[pb.WeightsChunk], context: grpc.ServicerContext
    ) -> pb.UpdateWeightsResponse:
        with self._call(context, "UpdateWeightsStream"):
            with self._refusals("stream"):
                tensors, version = assemble_stream(request_iterator)
                update = self.engine.load_tensors(tensors, version)
            return self._accepted(update, "stream")

    def GetModelInfo(  # noqa: N802 - gRPC method name
        self, request: pb.ModelInfoRequest, context: grpc.ServicerContext
    ) -> pb.ModelInfo:
        with self._call(context, "GetModelInfo"):
            info = self.engine.info
            return pb.ModelInfo(
                engine=info.kind,
                model=info.model,
                vocab_size=info.vocab_size,
                max_context=info.max_context,
                eos_token_ids=info.eos_token_ids,
                policy_version=self.engine.version,
            )

    def _refusals(self, source: str) -> _CountRefusals:
        return _CountRefusals(self.metrics, source)

    def _accepted(self, update: WeightUpdate, source: str) -> pb.UpdateWeightsResponse:
        self.metrics.policy_version.set(self.engine.version)
        self.metrics.update_seconds.labels(source).observe(update.seconds)
        self.metrics.update_bytes.labels(source).inc(update.bytes)
        return pb.UpdateWeightsResponse(version=update.version, seconds=update.seconds, bytes=update.bytes)


class _CountRefusals:
    def __init__(self, metrics: RolloutMetrics, source: str) -> None:
        self.metrics = metrics
        self.source = source

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, WeightUpdateError):
            self.metrics.updates_refused.labels(self.source).inc()

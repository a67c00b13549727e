"""The gRPC transport of the teacher service: request in, `ScoringBatcher` call, scores out.

Unknown teachers, bad token ids, sequences over the context, a bad mode or k: INVALID_ARGUMENT
with a message. A teacher whose checkpoint cannot be loaded: FAILED_PRECONDITION.
"""

from __future__ import annotations

import grpc

from cascade.distill.modes import MODES, distill_mode, mode_of_enum
from cascade.distill.samples import SequenceScores
from cascade.distill.scoring import ScoreRequest
from cascade.engine.base import EngineRequestError
from cascade.transport.grpc_server import DEFAULT_MAX_MESSAGE_BYTES, RpcCall
from cascade_proto.v1 import teacher_pb2 as pb
from cascade_proto.v1 import teacher_pb2_grpc as pb_grpc
from services.teacher.batching import ScoringBatcher
from services.teacher.metrics import TeacherMetrics
from services.teacher.pool import TeacherLoadError, TeacherPool, TeacherStatus, UnknownTeacherError

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TeacherService"].full_name
_ENUM_NAMES = [pb.LogprobMode.Name(m.proto_enum) for m in MODES.values()]
BAD_MODE = f"mode: set {', '.join(_ENUM_NAMES[:-1])} or {_ENUM_NAMES[-1]}"


class BadRequest(ValueError):
    pass


class TeacherServicer(pb_grpc.TeacherServiceServicer):
    def __init__(
        self,
        pool: TeacherPool,
        batcher: ScoringBatcher,
        metrics: TeacherMetrics,
        *,
        max_sequences: int = 4096,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.pool = pool
        self.batcher = batcher
        self.metrics = metrics
        self.max_sequences = max_sequences
        self.max_message_bytes = max_message_bytes

    def _call(self, context: grpc.ServicerContext, method: str) -> RpcCall:
        return RpcCall(
            context,
            self.metrics,
            method,
            invalid=(BadRequest, EngineRequestError, UnknownTeacherError),
            precondition=(TeacherLoadError,),
        )

    def Logprobs(  # noqa: N802 - gRPC method name
        self, request: pb.LogprobsRequest, context: grpc.ServicerContext
    ) -> pb.LogprobsResponse:
        with self._call(context, "Logprobs"):
            with self.batcher.announce():
                score_request = self._parse(request)
                future = self.batcher.submit(request.teacher, score_request)
            scored = future.result(timeout=context.time_remaining())
            self._sync_pool_metrics()
            mode = distill_mode(score_request.mode)
            tokens = sum(len(c) for c in score_request.completion_ids)
            too_big = mode.reply_size_error(tokens, scored.vocab_size, self.max_message_bytes)
            if too_big is not None:
                raise BadRequest(too_big)
            reply = pb.LogprobsResponse(
                teacher=request.teacher,
                checkpoint=scored.checkpoint,
                vocab_size=scored.vocab_size,
                topk=mode.reply_topk(score_request.topk),
                sequences=[_sequence(s) for s in scored.scores],
            )
            self.metrics.record_response(request.teacher, mode.name, tokens, reply.ByteSize())
            return reply

    def SetTeacher(  # noqa: N802 - gRPC method name
        self, request: pb.SetTeacherRequest, context: grpc.ServicerContext
    ) -> pb.TeacherInfo:
        with self._call(context, "SetTeacher"):
            if not request.name:
                raise BadRequest("name: empty")
            if not request.checkpoint_path:
                raise BadRequest("checkpoint_path: empty")
            try:
                status = self.pool.set(request.name, request.checkpoint_path)
            except TeacherLoadError as err:
                raise BadRequest(f"checkpoint_path: {err}") from None
            self._sync_pool_metrics()
            return _info(status)

    def ListTeachers(  # noqa: N802 - gRPC method name
        self, request: pb.ListTeachersRequest, context: grpc.ServicerContext
    ) -> pb.ListTeachersResponse:
        with self._call(context, "ListTeachers"):
            return pb.ListTeachersResponse(
                teachers=[_info(s) for s in self.pool.statuses()],
                memory_budget_bytes=self.pool.memory_budget_bytes,
            )

    def _parse(self, request: pb.LogprobsRequest) -> ScoreRequest:
        if not request.teacher:
            raise BadRequest("teacher: empty")
        if request.teacher not in self.pool.names():
            known = ", ".join(self.pool.names()) or "none"
            raise BadRequest(f"teacher: unknown teacher {request.teacher!r} (known: {known})")
        mode = mode_of_enum(request.mode)
        if mode is None:
            raise BadRequest(BAD_MODE)
        if not request.sequences:
            raise BadRequest("sequences: empty (at least one sequence)")
        if len(request.sequences) > self.max_sequences:
            raise BadRequest(f"sequences: {len(request.sequences)} over the limit of {self.max_sequences}")
        return ScoreRequest(
            prompt_ids=[list(s.prompt_ids) for s in request.sequences],
            completion_ids=[list(s.completion_ids) for s in request.sequences],
            mode=mode.name,
            temperature=request.temperature if request.HasField("temperature") else 1.0,
            topk=request.topk,
        )

    def _sync_pool_metrics(self) -> None:
        self.metrics.resident_bytes.set(self.pool.resident_bytes)
        self.metrics.loads.set(self.pool.loads)
        self.metrics.evictions.set(self.pool.evictions)


def _sequence(s: SequenceScores) -> pb.SequenceLogprobs:
    out = pb.SequenceLogprobs()
    if s.logprobs is not None:
        out.logprobs.extend(s.logprobs.tolist())
    if s.topk_ids is not None and s.topk_logprobs is not None:
        out.topk_ids.extend(s.topk_ids.flatten().tolist())
        out.topk_logprobs.extend(s.topk_logprobs.flatten().tolist())
    if s.full_logprobs is not None:
        out.full_logprobs.extend(s.full_logprobs.flatten().tolist())
    return out


def _info(s: TeacherStatus) -> pb.TeacherInfo:
    return pb.TeacherInfo(name=s.name, checkpoint=s.path, loaded=s.loaded, bytes=s.bytes)

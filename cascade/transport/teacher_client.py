"""A typed client of the teacher service (`proto/cascade/v1/teacher.proto`): token ids in,
`cascade.distill.samples.SequenceScores` (tensors, like the in-process computation) out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from cascade.distill.modes import Mode, SampledMode, distill_mode
from cascade.distill.samples import SequenceScores
from cascade.transport.channel import open_channel
from cascade_proto.v1 import teacher_pb2 as pb
from cascade_proto.v1 import teacher_pb2_grpc as pb_grpc


@dataclass
class TeacherReply:
    teacher: str
    checkpoint: str
    scores: list[SequenceScores]
    wire_bytes: int  # serialized size of the response message


class TeacherClient:
    def __init__(self, target: str | grpc.Channel, *, timeout_s: float = 600.0) -> None:
        self._own = isinstance(target, str)
        self.channel = open_channel(target) if isinstance(target, str) else target
        self.stub = pb_grpc.TeacherServiceStub(self.channel)
        self.timeout_s = timeout_s

    def close(self) -> None:
        if self._own:
            self.channel.close()

    def logprobs(
        self,
        teacher: str,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        *,
        mode: Mode = SampledMode.name,
        temperature: float = 1.0,
        topk: int = 0,
    ) -> TeacherReply:
        request = pb.LogprobsRequest(
            teacher=teacher,
            mode=distill_mode(mode).proto_enum,
            topk=topk,
            temperature=temperature,
            sequences=[
                pb.ScoredSequence(prompt_ids=p, completion_ids=c)
                for p, c in zip(prompt_ids, completion_ids, strict=True)
            ],
        )
        reply = self.stub.Logprobs(request, timeout=self.timeout_s)
        return TeacherReply(
            teacher=reply.teacher,
            checkpoint=reply.checkpoint,
            scores=[_scores(s, len(c), reply) for s, c in zip(reply.sequences, completion_ids, strict=True)],
            wire_bytes=reply.ByteSize(),
        )

    def set_teacher(self, name: str, checkpoint_path: str) -> pb.TeacherInfo:
        return self.stub.SetTeacher(
            pb.SetTeacherRequest(name=name, checkpoint_path=checkpoint_path), timeout=self.timeout_s
        )

    def list_teachers(self) -> pb.ListTeachersResponse:
        return self.stub.ListTeachers(pb.ListTeachersRequest(), timeout=self.timeout_s)


def _tensor(values: Iterable[float] | Iterable[int], dtype: type, n: int) -> torch.Tensor:
    """A repeated proto field as a tensor (`np.fromiter` is ~3x faster than `list` here)."""
    return torch.from_numpy(np.fromiter(values, dtype=dtype, count=n))


def _scores(s: pb.SequenceLogprobs, n: int, reply: pb.LogprobsResponse) -> SequenceScores:
    out = SequenceScores()
    if len(s.logprobs):
        out.logprobs = _tensor(s.logprobs, np.float32, len(s.logprobs))
    if len(s.topk_ids):
        out.topk_ids = _tensor(s.topk_ids, np.int64, len(s.topk_ids)).view(n, reply.topk)
        out.topk_logprobs = _tensor(s.topk_logprobs, np.float32, len(s.topk_logprobs)).view(n, reply.topk)
    if len(s.full_logprobs):
        full = _tensor(s.full_logprobs, np.float32, len(s.full_logprobs))
        out.full_logprobs = full.view(n, reply.vocab_size)
    return out

"""A typed client of the reward service (`proto/cascade/v1/reward.proto`): problems and
completions in, `RewardVerdict`s (in order) out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc

from cascade.domains.base import Problem, RewardVerdict
from cascade_proto.v1 import reward_pb2 as pb
from cascade_proto.v1 import reward_pb2_grpc as pb_grpc


class RewardClient:
    def __init__(self, target: str | grpc.Channel, *, timeout_s: float = 600.0) -> None:
        self._own = isinstance(target, str)
        self.channel = grpc.insecure_channel(target) if isinstance(target, str) else target
        self.stub = pb_grpc.RewardServiceStub(self.channel)
        self.timeout_s = timeout_s

    def close(self) -> None:
        if self._own:
            self.channel.close()

    def score(
        self,
        domain: str,
        problems: Sequence[Problem],
        completions: Sequence[str],
        *,
        reward_config: dict[str, Any] | None = None,
    ) -> list[RewardVerdict]:
        request = pb.ScoreRequest(
            domain=domain,
            reward_config_json=json.dumps(reward_config) if reward_config else "",
            items=[
                pb.Item(problem=_problem(p), completion=c) for p, c in zip(problems, completions, strict=True)
            ],
        )
        reply = self.stub.Score(request, timeout=self.timeout_s)
        out: list[RewardVerdict | None] = [None] * len(problems)
        for v in reply.verdicts:
            out[v.index] = RewardVerdict(v.reward, v.reason, v.detail)
        missing = [i for i, v in enumerate(out) if v is None]
        if missing:
            raise RuntimeError(f"reward service returned no verdict for items {missing[:5]}")
        return [v for v in out if v is not None]


def _problem(p: Problem) -> pb.Problem:
    return pb.Problem(id=p.id, prompt=p.prompt, answer=p.answer, meta_json=json.dumps(p.meta))

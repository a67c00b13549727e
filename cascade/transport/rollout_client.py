"""A typed client of the rollout service (`proto/cascade/v1/rollout.proto`).

The learner's side of the contract: token-id prompts and `SamplingSettings` in, a
`VersionedGeneration` (prompt-major, like the in-process engine's) out; weight updates from a
shared checkpoint path or streamed from a state dict in chunks of `chunk_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc
import torch

from cascade.engine.base import EngineInfo, Generation, SamplingSettings, VersionedGeneration, WeightUpdate
from cascade.engine.weights import DTYPES
from cascade.transport.channel import open_channel
from cascade_proto.v1 import rollout_pb2 as pb
from cascade_proto.v1 import rollout_pb2_grpc as pb_grpc

DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}

ChatPrompt = Sequence[Mapping[str, str]]


@dataclass
class RemoteGeneration:
    prompt_ids: list[list[int]]  # one per request prompt, as the engine saw it
    result: VersionedGeneration


class RolloutClient:
    def __init__(self, target: str | grpc.Channel, *, timeout_s: float = 600.0) -> None:
        self._own = isinstance(target, str)
        self.channel = open_channel(target) if isinstance(target, str) else target
        self.stub = pb_grpc.RolloutServiceStub(self.channel)
        self.timeout_s = timeout_s

    def close(self) -> None:
        if self._own:
            self.channel.close()

    def generate(
        self,
        prompts: Sequence[Sequence[int] | ChatPrompt],
        *,
        group_size: int,
        sampling: SamplingSettings,
        thinking: bool = False,
    ) -> RemoteGeneration:
        reply = self.stub.Generate(
            generate_request(prompts, group_size=group_size, sampling=sampling, thinking=thinking),
            timeout=self.timeout_s,
        )
        return from_response(reply, group_size)

    def update_weights(self, checkpoint_path: str, version: int | None = None) -> WeightUpdate:
        request = pb.UpdateWeightsRequest(checkpoint_path=checkpoint_path)
        if version is not None:
            request.version = version
        reply = self.stub.UpdateWeights(request, timeout=self.timeout_s)
        return WeightUpdate(reply.version, reply.seconds, reply.bytes, checkpoint_path)

    def stream_weights(
        self, tensors: Mapping[str, torch.Tensor], version: int | None = None, *, chunk_bytes: int = 4 << 20
    ) -> WeightUpdate:
        reply = self.stub.UpdateWeightsStream(
            weight_chunks(tensors, version, chunk_bytes=chunk_bytes), timeout=self.timeout_s
        )
        return WeightUpdate(reply.version, reply.seconds, reply.bytes, "streamed weights")

    def model_info(self, *, timeout_s: float | None = None) -> tuple[EngineInfo, int]:
        """What is served and its current policy version (`timeout_s`: a quick probe's)."""
        info = self.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=timeout_s or self.timeout_s)
        engine = EngineInfo(
            kind=info.engine,
            model=info.model,
            vocab_size=info.vocab_size,
            max_context=info.max_context,
            eos_token_ids=list(info.eos_token_ids),
            pad_token_id=-1,
        )
        return engine, info.policy_version


def generate_request(
    prompts: Sequence[Sequence[int] | ChatPrompt],
    *,
    group_size: int,
    sampling: SamplingSettings,
    thinking: bool,
) -> pb.GenerateRequest:
    settings = pb.SamplingSettings(
        temperature=sampling.temperature, top_p=sampling.top_p, greedy=sampling.greedy
    )
    if sampling.seed is not None:
        settings.seed = sampling.seed
    request = pb.GenerateRequest(
        group_size=group_size, sampling=settings, max_tokens=sampling.max_tokens, thinking=thinking
    )
    if sampling.turn is not None:
        t = sampling.turn
        request.turn.CopyFrom(
            pb.TurnStep(caller=t.caller, rollout=t.rollout, round=t.round, episodes=t.episodes)
        )
    for prompt in prompts:
        if prompt and isinstance(prompt[0], Mapping):
            messages = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in prompt]  # type: ignore[index]
            request.prompts.append(pb.Prompt(chat=pb.Chat(messages=messages)))
        else:
            request.prompts.append(pb.Prompt(token_ids=pb.TokenIds(ids=list(prompt))))  # type: ignore[arg-type]
    return request


def from_response(reply: pb.GenerateResponse, group_size: int) -> RemoteGeneration:
    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    reasons: list[str] = []
    for group in reply.groups:
        for c in group.completions:
            completions.append(list(c.token_ids))
            logprobs.append(list(c.logprobs))
            reasons.append(FINISH.get(c.finish_reason, "length"))
    gen = Generation(completion_ids=completions, logprobs=logprobs, finish_reasons=reasons)
    return RemoteGeneration(
        prompt_ids=[list(g.prompt_ids) for g in reply.groups],
        result=VersionedGeneration(generation=gen, version=reply.policy_version, n=group_size),
    )


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def weight_chunks(
    tensors: Mapping[str, torch.Tensor], version: int | None, *, chunk_bytes: int
) -> Iterator[pb.WeightsChunk]:
    """Each tensor as one or more chunks of at most `chunk_bytes` (the first carries `version`)."""
    first = True
    for name, t in tensors.items():
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"{name}: dtype {t.dtype} cannot be streamed (one of {sorted(DTYPES)})")
        data = tensor_bytes(t)
        for start in range(0, max(len(data), 1), chunk_bytes):
            chunk = pb.WeightsChunk(
                name=name,
                dtype=DTYPE_NAMES[t.dtype],
                shape=list(t.shape),
                data=data[start : start + chunk_bytes],
            )
            if first and version is not None:
                chunk.version = version
            first = False
            yield chunk

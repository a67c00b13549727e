"""Proto messages to engine calls: prompts (token ids or chat), sampling settings, streamed
weights. Everything a client can get wrong raises `BadRequest` with the field's name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from cascade.config import ChatConfig
from cascade.engine.base import SamplingSettings, TurnStep, WeightUpdateError
from cascade.engine.weights import tensor_from_bytes
from cascade.model.chat import encode_messages
from cascade_proto.v1 import rollout_pb2 as pb

ROLES = ("system", "user", "assistant")


class BadRequest(ValueError):
    pass


@dataclass(frozen=True)
class Limits:
    max_prompts: int = 4096
    max_group_size: int = 1024


@dataclass
class GenerateCall:
    prompt_ids: list[list[int]]
    n: int
    sampling: SamplingSettings


def parse_generate(
    request: pb.GenerateRequest, tokenizer: PreTrainedTokenizerBase, chat: ChatConfig, limits: Limits
) -> GenerateCall:
    if not request.prompts:
        raise BadRequest("prompts: empty (at least one prompt)")
    if len(request.prompts) > limits.max_prompts:
        raise BadRequest(f"prompts: {len(request.prompts)} over the limit of {limits.max_prompts}")
    if request.group_size < 1:
        raise BadRequest(f"group_size: must be at least 1 (got {request.group_size})")
    if request.group_size > limits.max_group_size:
        raise BadRequest(f"group_size: {request.group_size} over the limit of {limits.max_group_size}")
    if request.max_tokens < 1:
        raise BadRequest(f"max_tokens: must be at least 1 (got {request.max_tokens})")
    prompt_ids = [_prompt(i, p, tokenizer, chat, request.thinking) for i, p in enumerate(request.prompts)]
    s = request.sampling
    turn = None
    if request.HasField("turn"):
        t = request.turn
        turn = TurnStep(t.caller, t.rollout, t.round, tuple(t.episodes))
    sampling = SamplingSettings(
        max_tokens=request.max_tokens,
        temperature=s.temperature if s.HasField("temperature") else 1.0,
        top_p=s.top_p if s.HasField("top_p") else 1.0,
        greedy=s.greedy,
        seed=s.seed if s.HasField("seed") else None,
        turn=turn,
    )
    return GenerateCall(prompt_ids=prompt_ids, n=request.group_size, sampling=sampling)


def _prompt(
    i: int, prompt: pb.Prompt, tokenizer: PreTrainedTokenizerBase, chat: ChatConfig, thinking: bool
) -> list[int]:
    kind = prompt.WhichOneof("kind")
    if kind == "token_ids":
        if not prompt.token_ids.ids:
            raise BadRequest(f"prompts[{i}].token_ids: empty prompt (at least one token)")
        return list(prompt.token_ids.ids)
    if kind == "chat":
        messages = prompt.chat.messages
        if not messages:
            raise BadRequest(f"prompts[{i}].chat: no messages")
        for j, m in enumerate(messages):
            if m.role not in ROLES:
                raise BadRequest(f"prompts[{i}].chat.messages[{j}].role: {m.role!r} not one of {ROLES}")
        if not any(m.role == "user" and m.content.strip() for m in messages):
            raise BadRequest(f"prompts[{i}].chat: empty prompt (no user message with content)")
        try:
            return encode_messages(
                tokenizer, chat, [{"role": m.role, "content": m.content} for m in messages], thinking
            )
        except Exception as err:  # the template's own checks (e.g. role order)
            raise BadRequest(f"prompts[{i}].chat: the chat template refused it: {err}") from None
    raise BadRequest(f"prompts[{i}]: empty prompt (set token_ids or chat)")


def assemble_stream(chunks: Iterable[pb.WeightsChunk]) -> tuple[dict[str, torch.Tensor], int | None]:
    """Streamed chunks to a state dict; a tensor's chunks are consecutive and share its header."""
    tensors: dict[str, torch.Tensor] = {}
    version: int | None = None
    current: pb.WeightsChunk | None = None
    parts: list[bytes] = []

    def finish() -> None:
        assert current is not None
        if current.name in tensors:
            raise WeightUpdateError(f"streamed weights: {current.name} sent twice (not consecutive chunks?)")
        tensors[current.name] = tensor_from_bytes(
            current.name, current.dtype, list(current.shape), b"".join(parts)
        )

    for i, chunk in enumerate(chunks):
        if i == 0 and chunk.HasField("version"):
            version = chunk.version
        if not chunk.name:
            raise WeightUpdateError(f"streamed weights: chunk {i} has no tensor name")
        if current is not None and chunk.name == current.name:
            if chunk.dtype != current.dtype or list(chunk.shape) != list(current.shape):
                raise WeightUpdateError(f"streamed weights: {chunk.name}: chunks disagree on dtype or shape")
            parts.append(chunk.data)
            continue
        if current is not None:
            finish()
        current, parts = chunk, [chunk.data]
    if current is None:
        raise WeightUpdateError("streamed weights: empty stream (no tensors)")
    finish()
    return tensors, version

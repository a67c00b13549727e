"""The interface every generation engine (Hugging Face, vLLM) offers the rollout side.

An engine samples groups of completions with per-token log-probs and takes new weights while
serving. Each result carries the policy version of the weights that produced it, so the
learner can enforce `max_staleness`. Request checks that do not depend on the engine (empty
prompts, token ids outside the vocabulary, a budget over the context) live here, so both
engines refuse the same inputs with the same messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


@dataclass
class Generation:
    """Sampled completions, one row per (prompt, sample), with their log-probs."""

    completion_ids: list[list[int]]  # without padding, EOS included when produced
    logprobs: list[list[float]]  # one per completion token, at the sampling temperature
    finish_reasons: list[str]  # "stop" (EOS) or "length" (token budget)


class EngineRequestError(ValueError):
    """The request itself is wrong (the caller's fault); the engine is unaffected."""


class WeightUpdateError(ValueError):
    """New weights were refused; the engine keeps serving the previous ones."""


@dataclass(frozen=True)
class TurnStep:
    """Which round of which multi-turn rollout a request is (`cascade.tools.turn_loop`), so that
    the HF engine can keep the keys/values it computed and reuse them in the next round
    (`cascade.engine.prefix_kv.TurnKV`). Engines that cannot (vLLM: prefix caching instead)
    ignore it; it never changes what round 0 computes.

    `caller` names who runs the turn loop (host, process, thread): an engine keeps at most one
    rollout per caller, and the caller's next rollout replaces it. `rollout` names this turn-loop
    call. Round 0 is the request itself (`n` completions per prompt; its rows are episodes
    0..len(prompts) * n - 1, prompt-major); round r >= 1 has one completion per prompt, and
    prompt i continues episode `episodes[i]`: its context is that episode's context of round
    r - 1, the tokens generated for it, and what the environment appended."""

    caller: str
    rollout: str
    round: int
    episodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class SamplingSettings:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    seed: int | None = None
    """Same seed, prompts and weights: same completions (per engine; engines differ)."""
    turn: TurnStep | None = None
    """A round of a multi-turn rollout (None: a request on its own)."""


@dataclass(frozen=True)
class EngineInfo:
    kind: str  # "hf" or "vllm"
    model: str  # the directory the engine started from
    vocab_size: int  # rows of the input embedding: valid token ids are [0, vocab_size)
    max_context: int  # prompt + completion tokens the model accepts
    eos_token_ids: list[int]
    pad_token_id: int


@dataclass
class VersionedGeneration:
    """Completions of every prompt, prompt-major: row i belongs to prompt i // n."""

    generation: Generation
    version: int
    n: int


@dataclass(frozen=True)
class WeightUpdate:
    version: int
    seconds: float
    bytes: int
    source: str = field(default="")


@runtime_checkable
class Engine(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    @property
    def version(self) -> int: ...

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        """`n` completions per prompt, all from one version of the weights."""
        ...

    def load_checkpoint(self, path: str | Path, version: int | None = None) -> WeightUpdate:
        """Switch to the weights of a checkpoint; refuses (WeightUpdateError) without harm."""
        ...

    def load_tensors(self, tensors: Mapping[str, torch.Tensor], version: int | None = None) -> WeightUpdate:
        """Switch to weights given as a state dict (streamed from the learner)."""
        ...

    def close(self) -> None: ...


def check_generate_request(
    info: EngineInfo, prompts: list[list[int]], n: int, sampling: SamplingSettings
) -> None:
    """Raise EngineRequestError naming the first thing wrong with a request."""
    if not prompts:
        raise EngineRequestError("prompts: empty (at least one prompt)")
    if n < 1:
        raise EngineRequestError(f"group_size: must be at least 1 (got {n})")
    if sampling.max_tokens < 1:
        raise EngineRequestError(f"max_tokens: must be at least 1 (got {sampling.max_tokens})")
    if not sampling.temperature > 0:
        raise EngineRequestError(f"temperature: must be > 0 (got {sampling.temperature})")
    if not 0 < sampling.top_p <= 1:
        raise EngineRequestError(f"top_p: must be in (0, 1] (got {sampling.top_p})")
    if sampling.turn is not None:
        check_turn_step(sampling.turn, len(prompts), n)
    for i, ids in enumerate(prompts):
        if not ids:
            raise EngineRequestError(f"prompts[{i}]: empty prompt (at least one token)")
        bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
        if bad is not None:
            raise EngineRequestError(
                f"prompts[{i}]: token id {bad} out of the vocabulary [0, {info.vocab_size})"
            )
        if len(ids) + sampling.max_tokens > info.max_context:
            raise EngineRequestError(
                f"prompts[{i}]: {len(ids)} prompt tokens + max_tokens {sampling.max_tokens} "
                f"exceed the model's context of {info.max_context} tokens"
            )


def check_turn_step(turn: TurnStep, prompts: int, n: int) -> None:
    if not turn.caller or not turn.rollout:
        raise EngineRequestError("turn: caller and rollout must be named")
    if turn.round < 0:
        raise EngineRequestError(f"turn.round: must be at least 0 (got {turn.round})")
    if turn.round == 0:
        if turn.episodes:
            raise EngineRequestError("turn.episodes: round 0's episodes are its rows (give none)")
        return
    if n != 1:
        raise EngineRequestError(
            f"turn: round {turn.round} continues episodes one by one (group_size 1, got {n})"
        )
    if len(turn.episodes) != prompts:
        raise EngineRequestError(f"turn.episodes: {len(turn.episodes)} for {prompts} prompts (one each)")
    if len(set(turn.episodes)) != len(turn.episodes) or min(turn.episodes) < 0:
        raise EngineRequestError("turn.episodes: each episode at most once, none negative")


def next_version(current: int, requested: int | None) -> int:
    if requested is None:
        return current + 1
    if requested <= current:
        raise WeightUpdateError(f"version {requested} is not above the current version {current}")
    return requested

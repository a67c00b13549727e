"""Where and how a run trains and is kept: the model and its chat rendering, checkpoints, the
lease, the resilience bounds, the learner's device and precision, rollout seeding.

All but the model, the chat rendering and rollout seeding are left out of the training hash
(`cascade.config.diff`)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from cascade.config.base import StrictModel


class ChatConfig(StrictModel):
    """How prompts are rendered: the tokenizer's own chat template (or `template_path` /
    `template` in its place) plus the thinking flags.

    The flag is appended to the user message (Qwen3's soft switch) and `enable_thinking` is
    passed to the template, so a real Qwen3 directory and the tiny model behave alike.
    """

    think_flag: str = "/think"
    no_think_flag: str = "/no_think"
    system_prompt: str | None = None
    template_path: Path | None = None
    """A Jinja chat template file used instead of the tokenizer's own (for a base model whose
    tokenizer has none, or to change the format): every prompt the run renders goes through it.
    Relative to the config file's directory, as every path in a config file."""
    template: str | None = None
    """The same, as inline Jinja text (set at most one of `template_path` and `template`)."""

    @model_validator(mode="after")
    def _one_template(self) -> ChatConfig:
        if self.template_path is not None and self.template is not None:
            raise ValueError("set template_path or template, not both")
        if self.template is not None and not self.template.strip():
            raise ValueError("template: empty (leave it out to use the tokenizer's own)")
        return self

    def template_text(self) -> str | None:
        """The chat template this config gives (None: the tokenizer's own). A file is read once
        per process (OSError when it cannot be: `cascade validate` checks it first)."""
        if self.template is not None:
            return self.template
        if self.template_path is not None:
            return _read_template(str(self.template_path))
        return None


@lru_cache(maxsize=8)
def _read_template(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


class ModelConfig(StrictModel):
    path: Path
    """A Hugging Face checkpoint directory (the tiny model or e.g. a Qwen3 directory)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class CheckpointConfig(StrictModel):
    every: int = Field(10, ge=1)
    """Stage steps between resumable checkpoints."""
    keep_last: int = Field(2, ge=1)


class LeaseConfig(StrictModel):
    """The runner's lease on its cascade in the store (one live runner per cascade)."""

    heartbeat_s: float = Field(5.0, gt=0)
    """Seconds between renewals."""
    expiry_s: float = Field(30.0, gt=0)
    """Seconds without a renewal after which the runner counts as dead: its run shows as
    `stalled` and another runner (`--resume`) may take over."""

    @model_validator(mode="after")
    def _expiry_after_heartbeats(self) -> LeaseConfig:
        if self.expiry_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"expiry_s ({self.expiry_s:g}) must be at least twice heartbeat_s ({self.heartbeat_s:g})"
            )
        return self


class ResilienceConfig(StrictModel):
    """How long a run rides out each dependency's outage (`cascade.resilience`) before it stops
    with the reason and its resume command. An outage is counted from the first failed call to
    the first that succeeds; calls in it are retried with capped backoff. Not a training setting
    (`cascade.config.diff`): a run may resume with other bounds."""

    database_s: float = Field(300.0, ge=0)
    """The store (Postgres or SQLite): a failover or a restart takes seconds to a minute."""
    redis_s: float = Field(300.0, ge=0)
    """Redis (the rollout request and result streams; the reward broker)."""
    teacher_s: float = Field(300.0, ge=0)
    """The teacher service (distillation log-probs)."""
    rollout_s: float = Field(300.0, ge=0)
    """The rollout service: every replica down at once (one down of several: the others serve)."""
    reward_s: float = Field(300.0, ge=0)
    """The reward service, where the distributed learner's evals of code and swe are scored."""


DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
"""`auto`, `cpu`, `cuda` or `cuda:N` (the learner's `learner.device`, and `--device`)."""


class LearnerConfig(StrictModel):
    """Where the learner trains and in what precision (embedded `cascade run` and the distributed
    learner alike). Not a training setting in the config hash (`cascade.config.diff`): a run
    may resume on another device; the numerics differ only by the precision's rounding."""

    device: str = Field("auto", pattern=DEVICE_PATTERN)
    """`auto` (the first CUDA device when torch sees one, else the CPU), `cpu`, `cuda` or
    `cuda:N`. The policy, the KL reference, local teachers and every tensor of the loss live
    there. A CUDA device on a host without one is an error at start, naming this field."""
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    """`auto`: bfloat16 autocast for the forward passes on CUDA (float32 master weights, losses
    and reductions in float32; frozen reference and teachers held in bfloat16), plain float32
    on the CPU (bit for bit what a CPU run always computed). `float32`: full precision
    everywhere. `bfloat16`: the CUDA policy, refused on the CPU."""
    memory_gib: float | None = Field(None, gt=0)
    """The memory a learner step may use, in GiB (`cascade.runner.step_memory`): a stage whose step
    certainly needs more is refused by `cascade validate` and before a run writes anything.
    Default: this machine's (the CUDA device's, else the RAM); set it for a bigger machine."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """The most padded tokens (prompt + completion columns x rows) one forward+backward of the
    learner holds: a step's sequences are cut, in order, into micro-batches under this budget
    (a longer sequence is a micro-batch of its own), gradients accumulate, and the optimizer
    steps once. The loss is normalised over the whole step before the cut, so the update does
    not depend on it (to float rounding). None: the whole step in one forward, as small models
    on a CPU run. `cascade validate` names this field when a step does not fit."""
    micro_batch_sequences: int | None = Field(None, ge=1)
    """The most sequences in one micro-batch (with `micro_batch_tokens`, whichever binds first)."""
    logits_chunk_mib: float = Field(256.0, gt=0)
    """The float32 logits one chunk of completion tokens may hold (tokens x vocabulary x 4
    bytes): log-probs, entropy and the distillation terms are computed chunk by chunk and
    recomputed in the backward, so no [sequences, tokens, vocabulary] tensor exists. A step
    whose whole logits fit in one chunk runs the plain forward (the tiny models do)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (the model's own gradient checkpointing): activations of one micro-batch shrink to the
    layers' inputs, for about a third more compute. The same numbers on or off."""


class RolloutConfig(StrictModel):
    seeding: Literal["stream", "per_request"] = "stream"
    """How sampling is seeded. `stream`: one generator for the whole run (embedded mode only).
    `per_request`: each request of `prompts_per_request` prompts samples with a generator seeded
    from (seed, batch number, request index), so whichever process generates it gets the same
    tokens. The distributed mode always seeds per request; set it here for the embedded run to
    match a distributed one step for step."""
    prompts_per_request: int = Field(4, ge=1)
    """Prompts (each with its group) per generation request: one Redis message in distributed
    mode, the unit that rollout workers share out and re-claim after a crash."""


def device_setting(value: str) -> str:
    """A `--device` value checked against `auto | cpu | cuda | cuda:N` (argparse `type=`)."""
    if not re.match(DEVICE_PATTERN, value):
        raise ValueError(f"{value!r} is not one of auto, cpu, cuda, cuda:N")
    return value

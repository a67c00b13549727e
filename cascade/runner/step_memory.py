"""Bounds on configs that would exhaust the machine: the memory one learner step needs, against
the memory the learner has, checked by `cascade validate` and before a runner writes anything.

The estimate is a lower bound of the learner's peak, from the model's `config.json` alone: the
weights, gradients and AdamW moments in float32, plus what a forward pass keeps for its backward
over the step's sequences (each linear layer's input and the MLP's gated values per token and
layer, the completion logits with their log-softmax and gradient), for the larger of the RL term
(`group_size x prompts_per_step` sequences) and the distillation term. Every sequence is taken at
its stage's largest token budget plus `PROMPT_TOKENS`. A config above it cannot run here; one
below may still not (attention, allocator slack, the rollout engine), so it refuses only what
is certainly too big, e.g. `group_size: 1000000000000`.

The machine's memory is the CUDA device's when the learner trains on one, else the host's RAM
(or the container's limit, if lower). `learner.memory_gib` replaces it: a config sized for a
bigger machine validates on a laptop.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cascade.config import CascadeConfig, StageConfig

PROMPT_TOKENS = 32
"""Prompt tokens assumed per sequence (a lower bound: chat markers and a short question)."""
GIB = 1024**3
DEFAULTS = {"group_size": 8, "prompts_per_step": 16, "budget.max_new_tokens": 32}
"""The GRPO fields' defaults: the one furthest above its default is named as the cause."""


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    tied: bool

    @classmethod
    def read(cls, model_dir: Path) -> ModelShape | None:
        """The shape from `config.json`; None when there is none to read (`check_paths` says so)."""
        try:
            data = json.loads((model_dir / "config.json").read_text())
        except (OSError, ValueError):
            return None
        data = data.get("text_config", data)
        try:
            hidden = int(data["hidden_size"])
            return cls(
                hidden=hidden,
                layers=int(data["num_hidden_layers"]),
                vocab=int(data["vocab_size"]),
                intermediate=int(data.get("intermediate_size") or 4 * hidden),
                tied=bool(data.get("tie_word_embeddings", False)),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        per_layer = 4 * self.hidden * self.hidden + 3 * self.hidden * self.intermediate
        return embeddings + self.layers * per_layer

    def sequence_bytes(self, tokens: int, completion: int, act_bytes: int) -> int:
        """What one sequence's forward keeps for the backward pass."""
        per_token = self.layers * (4 * self.hidden + 3 * self.intermediate) * act_bytes
        logits = completion * self.vocab * 4 * 3  # logits, log-softmax, their gradient (float32)
        return tokens * per_token + logits


def _largest_budget(stage: StageConfig) -> int:
    budget = stage.grpo.budget
    return max([budget.max_new_tokens, *budget.grow_to])


def _prompts_per_step(cfg: CascadeConfig, stage: StageConfig) -> int:
    """A step samples at most the whole train set (known up front for synthetic prompts)."""
    wanted = stage.grpo.prompts_per_step
    n_train = getattr(cfg.domain(stage.domain).prompts, "n_train", None)
    return min(wanted, n_train) if isinstance(n_train, int) else wanted


def _teachers(cfg: CascadeConfig, index: int) -> int:
    stage = cfg.stages[index]
    if not stage.distill.enabled or index == 0:
        return 0
    return len(cfg.teachers_for(index))


def machine_memory_bytes(device: str) -> tuple[int, str]:
    """The learner's memory and what it is (for the message)."""
    if device.startswith("cuda") or (device == "auto" and _has_nvidia_device()):
        import torch

        if torch.cuda.is_available():
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            total = int(torch.cuda.get_device_properties(index).total_memory)
            return total, f"cuda:{index}'s memory"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    what = "this host's RAM"
    limit = _cgroup_limit()
    if limit is not None and limit < total:
        total, what = limit, "this container's memory limit"
    return total, what


def _has_nvidia_device() -> bool:
    return "torch" in sys.modules or Path("/dev/nvidia0").exists()


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


@dataclass(frozen=True)
class StepEstimate:
    stage: int
    bytes: int
    field: str
    """The config field furthest above its default: what to lower."""
    detail: str


def estimate_steps(cfg: CascadeConfig, shape: ModelShape, *, act_bytes: int = 4) -> list[StepEstimate]:
    state = shape.params() * 16  # float32 weights, gradients and two AdamW moments
    out = []
    for i, stage in enumerate(cfg.stages):
        g = stage.grpo
        completion = _largest_budget(stage)
        per_seq = shape.sequence_bytes(PROMPT_TOKENS + completion, completion, act_bytes)
        prompts = _prompts_per_step(cfg, stage)
        rl_seqs = g.group_size * prompts
        d = stage.distill
        distill_seqs = _teachers(cfg, i) * d.prompts_per_teacher * d.samples_per_prompt
        total = state + max(rl_seqs, distill_seqs) * per_seq
        values = {
            "group_size": g.group_size,
            "prompts_per_step": prompts,
            "budget.max_new_tokens": completion,
        }
        if distill_seqs > rl_seqs:
            field = f"stages.{i}.distill.prompts_per_teacher"
            seqs = f"{distill_seqs} distillation sequences"
        else:
            worst = max(values, key=lambda k: values[k] / DEFAULTS[k])
            field = f"stages.{i}.grpo.{worst}"
            seqs = f"{g.group_size} x {prompts} sequences"
        detail = (
            f"{seqs} of up to {PROMPT_TOKENS + completion} tokens on a {shape.layers}-layer model "
            f"of hidden size {shape.hidden} and vocabulary {shape.vocab}"
        )
        out.append(StepEstimate(i, total, field, detail))
    return out


def step_memory_problems(cfg: CascadeConfig, device: str | None = None, *, ranks: int = 1) -> list[str]:
    """One `field: problem` line per stage whose step cannot fit in the learner's memory; with
    `ranks` > 1 (a sharded learner) each rank holds its share of the state and the sequences."""
    shape = ModelShape.read(cfg.model.path)
    if shape is None:
        return []
    if cfg.learner.memory_gib is not None:
        available, what = int(cfg.learner.memory_gib * GIB), "learner.memory_gib"
    else:
        available, what = machine_memory_bytes(device or cfg.learner.device)
    cuda = (device or cfg.learner.device).startswith("cuda") and what.startswith("cuda")
    problems = []
    for est in estimate_steps(cfg, shape, act_bytes=2 if cuda else 4):
        need = est.bytes / ranks
        if need > available:
            per = f" per rank of {ranks}" if ranks > 1 else ""
            problems.append(
                f"{est.field}: a step of stage {est.stage} needs at least {need / GIB:,.1f} GiB{per} "
                f"({est.detail}), more than the {available / GIB:,.1f} GiB of {what} "
                "(lower it, or set learner.memory_gib for a bigger machine)"
            )
    return problems

"""The memory one learner step needs, against the memory the learner has: checked by
`cascade validate` and before a runner writes anything (`step_memory_problems`), and exposed for
a given model shape and batch (`estimate_step`) so a benchmark can set it beside measured peaks.
How to size a run from it: docs/sizing.md, which derives every term below.

It is an estimate, not a bound. It counts, on one learner process (on the busiest rank of a
sharded learner), in bytes:

    peak = held + max(micro-batch, optimizer step)

- held for the whole step: the float32 master weights, their gradients and AdamW's two moments
  (16 bytes a parameter, over R ranks when sharded); the frozen models the stage keeps on the
  learner's device (the KL reference when `kl_coef > 0`; each teacher, in embedded mode); rank
  0's full copy of the policy in the checkpoint's dtype when sharded (the one that generates, is
  pushed and saved); the step's token tensors and the teachers' tokens for distillation;
- one micro-batch's forward and backward: the compute-dtype copies of the weights (autocast's
  casts; a sharded learner's gathered blocks), the activations the decoder layers keep for the
  backward (all of them, or with `learner.activation_checkpointing` each layer's input plus one
  layer's while it is recomputed), the hidden states at the completion positions, one vocabulary
  chunk's logits with their log-softmax and gradients, and the RL term's gradient kept while the
  distillation term's passes run (to tell the two gradient norms apart);
- the optimizer step: the gradient copies the norms take and AdamW's foreach temporary.

Every sequence is taken at its stage's largest token budget plus its domain's
`max_prompt_tokens` (`PROMPT_TOKENS` when not given). Left out:
the allocator's slack and fragmentation, attention kernels' workspaces, the transient tensors of
a backward in progress, the frozen models' own forward passes, the CUDA context, and the rollout
engine (its KV cache, eval generation). So a config under it may still not fit; one over it is
refused, with the setting that would make it fit (`learner.micro_batch_tokens`,
`learner.activation_checkpointing`, more ranks, or the stage's field that makes it too big).

The machine's memory is the CUDA device's when the learner trains on one, else the host's RAM
(or the container's limit, if lower). `learner.memory_gib` replaces it: a config sized for a
bigger machine validates on a laptop (set `learner.device: cuda` too, for the GPU's precision).
The rank count is not in the config: `cascade validate` checks a single-process learner; the
runner checks each rank of the learner it runs.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from cascade.config import CascadeConfig, StageConfig
from cascade.config.preflight import DEFAULT_PROMPT_TOKENS, prompt_tokens
from cascade.engine.microbatch import MicroBatching
from cascade.runner.domain_mix import prompt_counts

GIB = 1024**3
PROMPT_TOKENS = DEFAULT_PROMPT_TOKENS
"""Prompt tokens assumed per sequence (chat markers and a short question) when the stage's
domain does not give its `max_prompt_tokens`."""
DEFAULTS = {"group_size": 8, "prompts_per_step": 16, "budget.max_new_tokens": 32}
"""The GRPO fields' defaults: the one furthest above its default is named as the cause."""
MASTER_BYTES = 4
"""float32: master weights, gradients, each AdamW moment, and the residual stream and RMSNorms
(a float32 weight times a bfloat16 activation is float32, autocast or not)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TOKEN_BYTES = 24
"""The step's tensors per padded token: input ids, attention mask and position ids (int64)."""
COMPLETION_BYTES = 16
"""...and per completion position: completion ids (int64), mask and behaviour log-probs (float32)."""
MAX_RANKS = 4096
"""The most ranks a refusal suggests sharding over."""


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder's shape (a Llama / Qwen stack), from its `config.json`."""

    hidden: int
    layers: int
    vocab: int
    intermediate: int
    tied: bool
    heads: int
    kv_heads: int
    head_dim: int
    qk_norm: bool = False
    """RMSNorms on each head's queries and keys (Qwen3)."""

    @classmethod
    def from_config(cls, data: dict[str, Any]) -> ModelShape:
        """From a `config.json`'s fields (a multimodal config's `text_config`); KeyError,
        TypeError or ValueError when they are not there."""
        data = data.get("text_config", data)
        hidden = int(data["hidden_size"])
        heads = int(data.get("num_attention_heads") or max(1, hidden // 64))
        return cls(
            hidden=hidden,
            layers=int(data["num_hidden_layers"]),
            vocab=int(data["vocab_size"]),
            intermediate=int(data.get("intermediate_size") or 4 * hidden),
            tied=bool(data.get("tie_word_embeddings", False)),
            heads=heads,
            kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or hidden // heads),
            qk_norm=str(data.get("model_type", "")).startswith("qwen3"),
        )

    @classmethod
    def read(cls, model_dir: Path) -> ModelShape | None:
        """The shape from `config.json`; None when there is none to read (`check_paths` says so)."""
        try:
            return cls.from_config(json.loads((model_dir / "config.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def embedding_params(self) -> int:
        """The input embedding and, untied, the output layer."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def layer_params(self) -> int:
        h = self.hidden
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attention + 3 * h * self.intermediate + norms

    def params(self) -> int:
        return self.embedding_params() + self.layers * self.layer_params() + self.hidden

    def layer_activation_bytes(self, *, width: int, compute_dtype_bytes: int, masked: bool) -> int:
        """What one decoder layer keeps for its backward, per token, at `compute_dtype_bytes`
        (2: bfloat16 autocast over float32 weights; 4: float32). `masked`: the micro-batch has
        several rows, so padding, so an explicit attention mask of `width` keys (one row's
        needs none). Counted from what torch saves in Hugging Face's Qwen3/Llama layer; a unit
        test checks it against the saved tensors of a small model."""
        b, h, r = compute_dtype_bytes, self.hidden, MASTER_BYTES
        autocast = b < MASTER_BYTES
        q, kv = self.q_dim, self.kv_dim
        norms = 2 * (2 * r * h + 4)  # two RMSNorms: float32 input, normalized, rsqrt
        # the linear layers' inputs: under autocast each of q, k, v (and gate, up) casts its own
        # copy of the normed input; in float32 they read one tensor
        inputs = (5 if autocast else 2) * b * h
        qk_norm = ((r + b) * (q + kv) + 4 * (self.heads + self.kv_heads)) if self.qk_norm else 0
        # attention's q, k, v and output (o_proj reads the output) and its log-sum-exp; a mask
        # makes Hugging Face repeat k and v to every head, and the kernel keep a float copy
        kv_kept = q if masked else kv
        attention = b * (2 * q + 2 * kv_kept) + 4 * self.heads + (b * width if masked else 0)
        mlp = 4 * b * self.intermediate  # gate out, up out, act(gate), down's input
        return norms + inputs + qk_norm + attention + mlp

    def model_activation_bytes(self, *, width: int, masked: bool) -> int:
        """What the model keeps per token outside its decoder layers: the final RMSNorm (float32
        input, normalized, rsqrt), the embedding's ids, the rotary cos and sin, the boolean
        attention mask when there is one."""
        return 2 * MASTER_BYTES * self.hidden + 4 + 8 + 2 * 4 * self.head_dim + (width if masked else 0)


@dataclass(frozen=True)
class StepEstimate:
    """One learner step's memory, part by part, in bytes (per rank when sharded)."""

    weights: int
    """float32 master weights."""
    gradients: int
    """Their float32 gradients."""
    optimizer: int
    """AdamW's two float32 moments."""
    frozen: int
    """Frozen models on the learner's device: the KL reference, local teachers."""
    driver_copy: int
    """Rank 0 of a sharded learner: the full policy in the checkpoint's dtype."""
    teacher_data: int
    """The teachers' tokens for this rank's distillation rows."""
    step_data: int
    """The step's token tensors."""
    gradient_snapshot: int
    """The RL term's gradient, kept while the distillation term's passes run."""
    weight_copies: int
    """The weights in the compute dtype: autocast's casts, or a sharded learner's gathered root
    and decoder blocks with their unsharded gradients."""
    activations: int
    """What the forward keeps for the backward (checkpointed or not)."""
    completion_hidden: int
    """The last hidden states at the completion positions (what the vocabulary chunks read)."""
    logits_chunk: int
    """One vocabulary chunk: its logits (float32 and, under autocast, bfloat16), log-softmax, and
    their gradients."""
    optimizer_step: int
    """At the optimizer step: AdamW's foreach temporary."""
    sequences: int
    """RL rows of the step (this rank's)."""
    distill_sequences: int
    """Distillation rows of the step (this rank's)."""
    rows: int
    """Sequences per micro-batch (the largest term's)."""
    width: int
    """Tokens per sequence (prompt + completion)."""
    micro_batches: int
    """Micro-batches of the largest term (1: each term in one pass)."""

    HELD: ClassVar[tuple[str, ...]] = (
        "weights",
        "gradients",
        "optimizer",
        "frozen",
        "driver_copy",
        "teacher_data",
        "step_data",
    )
    PASS: ClassVar[tuple[str, ...]] = (
        "gradient_snapshot",
        "weight_copies",
        "activations",
        "completion_hidden",
        "logits_chunk",
    )

    @property
    def held(self) -> int:
        """Held for the whole step."""
        return sum(getattr(self, name) for name in self.HELD)

    @property
    def micro_batch(self) -> int:
        """Held while one micro-batch's forward and backward run."""
        return sum(getattr(self, name) for name in self.PASS)

    @property
    def total(self) -> int:
        """The estimated peak: what is held, plus the larger of a micro-batch and the optimizer step."""
        return self.held + max(self.micro_batch, self.optimizer_step)

    def parts(self) -> dict[str, int]:
        """Every part in bytes, then `held`, `micro_batch` and `total`."""
        out = {name: int(getattr(self, name)) for name in (*self.HELD, *self.PASS, "optimizer_step")}
        return {**out, "held": self.held, "micro_batch": self.micro_batch, "total": self.total}

    def describe(self) -> str:
        """The parts over 0.05 GiB, in GiB, largest first."""
        names = [n for n in (*self.HELD, *self.PASS, "optimizer_step") if getattr(self, n) >= GIB / 20]
        names.sort(key=lambda n: -getattr(self, n))
        return ", ".join(f"{n.replace('_', ' ')} {getattr(self, n) / GIB:,.1f}" for n in names) + " GiB"


def rows_per_micro_batch(batching: MicroBatching, width: int) -> int | None:
    """Sequences of `width` tokens one micro-batch holds under `batching`; None: no bound."""
    bounds = []
    if batching.tokens is not None:
        bounds.append(max(1, batching.tokens // width))
    if batching.sequences is not None:
        bounds.append(batching.sequences)
    return min(bounds) if bounds else None


def estimate_step(
    shape: ModelShape,
    *,
    sequences: int,
    prompt_tokens: int,
    completion_tokens: int,
    batching: MicroBatching,
    compute_dtype_bytes: int,
    distill_sequences: int = 0,
    teacher_token_bytes: int = 0,
    frozen_models: int = 0,
    frozen_dtype_bytes: int | None = None,
    ranks: int = 1,
    checkpoint_dtype_bytes: int = 2,
) -> StepEstimate:
    """The memory of one learner step of `sequences` RL rows and `distill_sequences`
    distillation rows (this rank's, when `ranks` > 1), each of `prompt_tokens` +
    `completion_tokens`, cut into micro-batches by `batching`.

    `compute_dtype_bytes`: 2 for bfloat16 autocast (CUDA, `precision: auto`), 4 for float32.
    `teacher_token_bytes`: the teachers' tokens per distillation completion position (see
    `teacher_token_bytes`). `frozen_models` copies held in `frozen_dtype_bytes` (default: the
    compute dtype's). `ranks`: the learner sharded with FSDP2 over that many; rank 0's full
    copy of the policy is in `checkpoint_dtype_bytes`."""
    if ranks < 1 or sequences < 0 or distill_sequences < 0:
        raise ValueError(f"ranks {ranks}, sequences {sequences}, distill_sequences {distill_sequences}")
    b = compute_dtype_bytes
    n = shape.params()
    width = prompt_tokens + completion_tokens
    limit = rows_per_micro_batch(batching, width)
    terms = [s for s in (sequences, distill_sequences) if s > 0] or [1]
    one_pass = limit is None or all(s <= limit for s in terms)

    def one_micro_batch(rows: int) -> tuple[int, int, int]:
        masked = rows > 1
        layer = shape.layer_activation_bytes(width=width, compute_dtype_bytes=b, masked=masked)
        if batching.activation_checkpointing:  # each layer's input, one layer recomputed
            per_token = shape.layers * MASTER_BYTES * shape.hidden + layer
        else:
            per_token = shape.layers * layer
        per_token += shape.model_activation_bytes(width=width, masked=masked)
        chunk_tokens = min(batching.chunk_rows(shape.vocab), rows * completion_tokens)
        chunk = chunk_tokens * shape.vocab * (4 * 4 + (b if b < 4 else 0))
        return rows * width * per_token, rows * completion_tokens * MASTER_BYTES * shape.hidden, chunk

    if one_pass:  # each term's forward in one pass, their graphs alive together until the backward
        rows = max(terms)
        passes = [one_micro_batch(s) for s in terms]
        activations = sum(p[0] for p in passes)
        hidden = sum(p[1] for p in passes)
        chunk = max(p[2] for p in passes)
        micro_batches = 1
    else:
        assert limit is not None
        rows = min(max(terms), limit)
        activations, hidden, chunk = one_micro_batch(rows)
        micro_batches = max(math.ceil(s / min(s, limit)) for s in terms)

    per_rank = 4 * n // ranks  # one float32 copy of the model, sharded
    if ranks == 1:
        weight_copies = n * b if b < MASTER_BYTES else 0
    else:  # FSDP2: the root (embeddings, output layer) stays gathered through the backward,
        # two decoder blocks are (one computing, one prefetched); the gradients of the root and
        # of one block exist unsharded before they are reduced
        e, layer = shape.embedding_params(), shape.layer_params()
        weight_copies = b * (e + 2 * layer) + b * (e + layer)
    both = sequences > 0 and distill_sequences > 0
    # the optimizer step: the RL gradient's copy is dropped once the distillation norm is taken
    # (one parameter's difference at a time); AdamW's foreach temporary (sqrt of the second moment)
    step_copies = 1
    return StepEstimate(
        weights=per_rank,
        gradients=per_rank,
        optimizer=2 * per_rank,
        frozen=frozen_models * n * (b if frozen_dtype_bytes is None else frozen_dtype_bytes),
        driver_copy=n * checkpoint_dtype_bytes if ranks > 1 else 0,
        teacher_data=distill_sequences * completion_tokens * teacher_token_bytes,
        step_data=(sequences + distill_sequences)
        * (width * TOKEN_BYTES + completion_tokens * COMPLETION_BYTES),
        gradient_snapshot=per_rank if both else 0,
        weight_copies=weight_copies,
        activations=activations,
        completion_hidden=hidden,
        logits_chunk=chunk,
        optimizer_step=step_copies * per_rank,
        sequences=sequences,
        distill_sequences=distill_sequences,
        rows=rows,
        width=width,
        micro_batches=micro_batches,
    )


def teacher_token_bytes(stage: StageConfig, vocab: int) -> int:
    """What the teachers' tokens of one distillation completion position take (`TeacherTokens`):
    `sampled`, the token's log-probs; `topk`, k ids and log-probs; `full`, the whole vocabulary."""
    d = stage.distill
    if d.loss == "full":
        return 4 * vocab
    if d.loss == "topk":
        return 12 * d.topk + 4
    return 8


# --------------------------------------------------------------------------- a cascade's stages


@dataclass(frozen=True)
class StagePrecision:
    """The bytes per value the learner computes and keeps frozen models in, and the checkpoint's."""

    compute: int
    frozen: int
    checkpoint: int

    @classmethod
    def of(cls, cfg: CascadeConfig, *, cuda: bool) -> StagePrecision:
        """`accel.resolve_learner`'s policy: bfloat16 autocast and bfloat16 frozen models on CUDA
        unless `precision: float32`; float32 compute and frozen models in the model's dtype else."""
        saved = DTYPE_BYTES[cfg.model.dtype]
        if cuda and cfg.learner.precision != "float32":
            return cls(compute=2, frozen=2, checkpoint=saved)
        return cls(compute=4, frozen=saved, checkpoint=saved)


def _largest_budget(stage: StageConfig) -> int:
    budget = stage.grpo.budget
    return max([budget.max_new_tokens, *budget.grow_to])


def _prompts_per_step(cfg: CascadeConfig, stage: StageConfig) -> int:
    """A step's RL prompts: each domain's share, at most its whole train set (known up front for
    synthetic prompts); none in an mopd stage."""
    if stage.kind == "mopd":
        return 0
    total = 0
    for domain, wanted in prompt_counts(stage.grpo.prompts_per_step, stage.mix).items():
        n_train = getattr(cfg.domain(domain).prompts, "n_train", None)
        total += min(wanted, n_train) if isinstance(n_train, int) else wanted
    return total


def _teachers(cfg: CascadeConfig, index: int) -> int:
    stage = cfg.stages[index]
    if not stage.distill.enabled or index == 0:
        return 0
    return len(cfg.teachers_for(index))


def estimate_stage(
    cfg: CascadeConfig,
    index: int,
    shape: ModelShape,
    precision: StagePrecision,
    *,
    ranks: int = 1,
    local_teachers: bool = True,
    batching: MicroBatching | None = None,
) -> StepEstimate:
    """The estimate for a step of stage `index` on the busiest rank of `ranks`: its share of
    whole groups and of each teacher's rows, at the stage's largest budget. `local_teachers`:
    the teachers are frozen models in this process (embedded mode), not the teacher service.
    `batching`: in place of the config's `learner.*` settings."""
    stage = cfg.stages[index]
    g, d = stage.grpo, stage.distill
    teachers = _teachers(cfg, index)
    per_teacher = d.prompts_per_teacher * d.samples_per_prompt
    if stage.kind == "mopd":  # each teacher on its domain's share of the step's prompts
        per_teacher = max(prompt_counts(g.prompts_per_step, stage.mix).values()) * d.samples_per_prompt
    frozen = (1 if g.kl_coef > 0 else 0) + (teachers if local_teachers else 0)
    return estimate_step(
        shape,
        sequences=g.group_size * math.ceil(_prompts_per_step(cfg, stage) / ranks),
        prompt_tokens=max(prompt_tokens(cfg, domain)[0] for domain in stage.mix),
        completion_tokens=_largest_budget(stage),
        batching=batching or MicroBatching.of(cfg.learner),
        compute_dtype_bytes=precision.compute,
        distill_sequences=teachers * math.ceil(per_teacher / ranks),
        teacher_token_bytes=teacher_token_bytes(stage, shape.vocab),
        frozen_models=frozen,
        frozen_dtype_bytes=precision.frozen,
        ranks=ranks,
        checkpoint_dtype_bytes=precision.checkpoint,
    )


def estimate_stages(
    cfg: CascadeConfig,
    shape: ModelShape,
    precision: StagePrecision,
    *,
    ranks: int = 1,
    local_teachers: bool = True,
) -> list[StepEstimate]:
    """`estimate_stage` for every stage, in order."""
    return [
        estimate_stage(cfg, i, shape, precision, ranks=ranks, local_teachers=local_teachers)
        for i in range(len(cfg.stages))
    ]


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


def _most(fits: Callable[[int], bool], high: int) -> int:
    """The largest n in [1, high] with `fits(n)` (taken as true up to some n, false after); 0
    when `fits(1)` is false."""
    if not fits(1):
        return 0
    lo, hi = 1, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fewest(fits: Callable[[int], bool], high: int) -> int | None:
    """The smallest n in [1, high] with `fits(n)` (false up to some n, true after); None if none."""
    if not fits(high):
        return None
    lo, hi = 1, high
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def _refusal(
    cfg: CascadeConfig,
    index: int,
    shape: ModelShape,
    precision: StagePrecision,
    available: int,
    *,
    ranks: int,
    local_teachers: bool,
) -> tuple[str, str]:
    """(the field to change, what to set) for a stage whose step does not fit in `available`."""
    learner = MicroBatching.of(cfg.learner)
    stage = cfg.stages[index]

    def at(rows: int, checkpointing: bool, ranks: int = ranks) -> StepEstimate:
        width = PROMPT_TOKENS + _largest_budget(stage)
        batching = replace(learner, tokens=rows * width, activation_checkpointing=checkpointing)
        return estimate_stage(
            cfg, index, shape, precision, ranks=ranks, local_teachers=local_teachers, batching=batching
        )

    now = estimate_stage(cfg, index, shape, precision, ranks=ranks, local_teachers=local_teachers)
    # the most rows to try: the step's, or what the current micro_batch_tokens allows (a
    # refusal never suggests a bigger micro-batch than the one that did not fit)
    upper = max(1, now.rows if now.micro_batches > 1 else max(now.sequences, now.distill_sequences))
    options: list[tuple[list[str], StepEstimate]] = []
    for checkpointing in sorted({learner.activation_checkpointing, True}):

        def fits(rows: int, checkpointing: bool = checkpointing) -> bool:
            return at(rows, checkpointing).total <= available

        rows = _most(fits, upper)
        if not rows:
            continue
        est = at(rows, checkpointing)
        settings = []
        if checkpointing and not learner.activation_checkpointing:
            settings.append("learner.activation_checkpointing: true")
        if rows < upper or (learner.tokens is not None and learner.tokens > rows * est.width):
            settings.append(f"learner.micro_batch_tokens: {rows * est.width}")
        options.append((settings, est))
    if options:
        said = [
            f"{' with '.join(settings)} ({est.rows} sequence{'s' * (est.rows > 1)} a micro-batch, "
            f"about {_gib(est.total)})"
            for settings, est in options
        ]
        tokens = any(s.startswith("learner.micro_batch_tokens") for settings, _ in options for s in settings)
        field = "learner.micro_batch_tokens" if tokens else "learner.activation_checkpointing"
        return field, "set " + ", or ".join(said)

    # not even one sequence at a time fits: what else takes the memory? The sharded state first
    def sharded(r: int) -> bool:
        return (
            estimate_stage(cfg, index, shape, precision, ranks=r, local_teachers=local_teachers).total
            <= available
        )

    shard, extra = _fewest(sharded, MAX_RANKS), ""
    one = at(1, True)
    if shard is None:
        shard = _fewest(lambda r: at(1, True, r).total <= available, MAX_RANKS)
        changed = []
        if not learner.activation_checkpointing:
            changed.append("learner.activation_checkpointing: true")
        if now.rows > 1:
            changed.append(f"learner.micro_batch_tokens: {one.width}")
        extra = f" with {' and '.join(changed)}" if changed else ""
    if shard is not None and shard > ranks:
        return "model.path", (
            f"its float32 weights, gradients and AdamW state alone take {_gib(16 * shape.params())} "
            f"(16 bytes for each of its {shape.params():,} parameters): shard the learner over "
            f"at least {shard} GPUs of this memory (`cascade run --nproc {shard}`, "
            f"`cascade up --learner-ranks {shard}`){extra}"
        )
    g, d = stage.grpo, stage.distill
    causes = {"step_data": one.step_data, "teacher_data": one.teacher_data, "frozen": one.frozen}
    causes["one_sequence"] = one.micro_batch
    cause = max(causes, key=lambda k: causes[k])
    prefix = f"stages.{index}"
    if cause == "teacher_data":
        if d.loss == "full":
            return f"{prefix}.distill.loss", "use topk: the full loss holds every vocabulary entry's log-prob"
        return f"{prefix}.distill.prompts_per_teacher", "lower it"
    if cause == "frozen":
        if g.kl_coef > 0 and (not local_teachers or _teachers(cfg, index) == 0):
            return f"{prefix}.grpo.kl_coef", "set it to 0: the KL reference is a frozen copy of the model"
        return f"{prefix}.distill.teachers", (
            "fewer teachers, or serve them (`cascade up`): each is a frozen copy of the model here"
        )
    if cause == "one_sequence":
        return f"{prefix}.grpo.budget.max_new_tokens", "lower it: one sequence's pass does not fit"
    values = {
        "group_size": g.group_size,
        "prompts_per_step": _prompts_per_step(cfg, stage),
        "budget.max_new_tokens": _largest_budget(stage),
    }
    worst = max(values, key=lambda k: values[k] / DEFAULTS[k])
    return f"{prefix}.grpo.{worst}", "lower it"


def step_memory_problems(
    cfg: CascadeConfig, device: str | None = None, *, ranks: int = 1, local_teachers: bool = True
) -> list[str]:
    """One `field: problem` line per stage whose step does not fit in the learner's memory.
    `ranks` > 1: a sharded learner, checked per rank. `local_teachers`: the teachers are frozen
    models on the learner's device (embedded mode; the distributed learner asks the teacher
    service)."""
    shape = ModelShape.read(cfg.model.path)
    if shape is None:
        return []
    setting = device or cfg.learner.device
    if cfg.learner.memory_gib is not None:
        available, what = int(cfg.learner.memory_gib * GIB), "learner.memory_gib"
        cuda = setting.startswith("cuda") or (setting == "auto" and Path("/dev/nvidia0").exists())
    else:
        available, what = machine_memory_bytes(setting)
        cuda = what.startswith("cuda")
    precision = StagePrecision.of(cfg, cuda=cuda)
    problems = []
    for i, est in enumerate(
        estimate_stages(cfg, shape, precision, ranks=ranks, local_teachers=local_teachers)
    ):
        if est.total <= available:
            continue
        field, fix = _refusal(cfg, i, shape, precision, available, ranks=ranks, local_teachers=local_teachers)
        per = f" per rank of {ranks}" if ranks > 1 else ""
        seqs = f"{est.sequences} sequences"
        if est.distill_sequences:
            seqs += f" and {est.distill_sequences} distillation sequences"
        cut = "in one pass" if est.micro_batches == 1 else f"in micro-batches of {est.rows}"
        detail = (
            f"{seqs} of {est.width} tokens {cut} on a {shape.layers}-layer model of hidden size "
            f"{shape.hidden} and vocabulary {shape.vocab}: {est.describe()}"
        )
        problems.append(
            f"{field}: a step of stage {i} needs about {_gib(est.total)}{per} ({detail}), more than "
            f"the {_gib(available)} of {what}: {fix} (or set learner.memory_gib for a bigger machine)"
        )
    return problems

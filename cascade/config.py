"""Typed configuration for a cascade: one YAML file, validated by these models.

The CLI, the services and the control plane all load cascades through `load_cascade_config`,
so a field means the same thing everywhere. Unknown fields are refused (a typo must not
silently fall back to a default), and every error names the field path.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cascade.config_hf import HfPrompts
from cascade.config_tracking import BackendName, TrackingConfig

DomainName = Literal["math", "code", "if", "swe", "rlhf", "agent"]
"""Domains with a verifier in `cascade.domains`."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- chat template


class ChatConfig(StrictModel):
    """How prompts are rendered: the tokenizer's own chat template plus the thinking flags.

    The flag is appended to the user message (Qwen3's soft switch) and `enable_thinking` is
    passed to the template, so a real Qwen3 directory and the tiny model behave alike.
    """

    think_flag: str = "/think"
    no_think_flag: str = "/no_think"
    system_prompt: str | None = None


# --------------------------------------------------------------------------- prompt sources


class SyntheticPrompts(StrictModel):
    """Prompts made by the domain's own generator (deterministic in `seed`)."""

    kind: Literal["synthetic"] = "synthetic"
    seed: int = 0
    n_train: int = Field(2000, ge=1)
    """Number of distinct training prompts."""
    n_eval: int = Field(128, ge=1)
    """Held-out prompts for the domain's eval (disjoint from training prompts)."""


class JsonlPrompts(StrictModel):
    """Prompts from JSON-lines files with fields `id`, `prompt`, `answer`, `meta`."""

    kind: Literal["jsonl"] = "jsonl"
    train_path: Path
    eval_path: Path


PromptSource = Annotated[SyntheticPrompts | JsonlPrompts | HfPrompts, Field(discriminator="kind")]


# --------------------------------------------------------------------------- rewards


class MathReward(StrictModel):
    kind: Literal["math"] = "math"
    timeout_s: float = Field(5.0, gt=0)
    """Bound on one parse+verify (math-verify's own timeouts need the main thread)."""
    max_response_chars: int = Field(32_000, ge=1)
    """Longer final responses (after the reasoning block) get `output_limit` and the lowest
    reward without being read (`cascade.domains.length_bound`)."""


class CodeReward(StrictModel):
    kind: Literal["code"] = "code"
    max_response_chars: int = Field(64_000, ge=1)
    """Longer final responses (after the reasoning block) get `output_limit` and the lowest
    reward without being read (`cascade.domains.length_bound`)."""
    mode: Literal["all_pass", "pass_fraction"] = "all_pass"
    """`all_pass`: 1 only when every test passes. `pass_fraction`: the tests the prompt shows
    (a problem's first `n_shown`) must all pass but are not paid; the reward is the share of
    hidden tests passed (a lookup table of the shown examples earns 0)."""
    time_limit_s: float = Field(2.0, gt=0)
    """One wall-clock budget per program: loading it and running all its tests."""
    memory_mb: int = Field(256, ge=16)
    max_output_bytes: int = Field(65536, ge=256)
    max_processes: int = Field(16, ge=1)
    sandbox: Literal["auto", "bwrap", "process"] = "auto"
    """`bwrap` (or `auto`, the same): the bubblewrap sandbox; without it the code reward refuses
    to run. `process`: rlimited forks, NOT a security boundary (a program can read its expected
    outputs); only when asked for here, with a loud warning; the reward service refuses it."""
    sandbox_uid: int = Field(61000, ge=1)
    """Non-root uid the bubblewrap sandbox runs as when the caller is root."""


class IfReward(StrictModel):
    kind: Literal["if"] = "if"
    max_response_chars: int = Field(32_000, ge=1)
    """Longer final responses (after the reasoning block) get `output_limit` and the lowest
    reward without being read (`cascade.domains.length_bound`)."""
    mode: Literal["all_pass", "fraction"] = "all_pass"
    """`all_pass`: 1 only if every instruction holds; `fraction`: share of instructions held."""


class SweReward(StrictModel):
    """The SWE patch reward. `mode` chooses how a patch that is not the gold one is judged:

    - `execution` (default): where the problem carries a repository and its tests (`meta.repo_files`,
      `meta.swe_tests`: every synthetic problem, and `swe` adapter rows with runnable tests, see
      `cascade.domains.hf_adapters`), the patch is applied to the repository's files and the tests
      run in the code sandbox: 1 when every test passes; 0 when one fails, when the patch does
      not apply, edits a test file, reaches outside the repository or leaves the files as they
      were; -1 when it does not parse or is over the caps. A problem without tests is scored as
      `exact_or_judge`.
    - `exact_or_judge`: nothing runs. 1 for the gold patch (up to whitespace); any other patch
      earns only what the judge model (`judge_model_path`) gives it, 0 without a judge.
    - `similarity`: OPT-IN, KNOWN TO BE GAMEABLE. 1 for the gold patch, else SWE-RL-style lexical
      similarity to the gold (blended with a plugged-in semantic scorer by `semantic_weight`).
      It pays 0.6-0.96 for patches that fix nothing (a comment appended to the buggy line, the
      line deleted, the gold hunk followed by its revert, a junk line in the right file) and
      only ~0.6 for a correct fix written as a whole-file rewrite: a policy trained on it learns
      to resemble the gold patch, not to fix the bug.
    """

    kind: Literal["swe"] = "swe"
    max_response_chars: int = Field(64_000, ge=1)
    """Longer final responses (after the reasoning block) get `output_limit` and the lowest
    reward without being read (`cascade.domains.length_bound`)."""
    mode: Literal["execution", "exact_or_judge", "similarity"] = "execution"
    max_patch_chars: int = Field(20_000, ge=1)
    """Longer extracted patches score -1 (`output_limit`) before parsing."""
    max_changed_lines: int = Field(400, ge=1)
    """Patches removing+adding more lines score -1 (`output_limit`)."""
    max_completion_chars: int = Field(200_000, ge=1)
    """Longer completions score -1 (`output_limit`) before any patch extraction."""
    semantic_weight: float = Field(0.5, ge=0, le=1)
    """`similarity` mode only: weight of a plugged-in semantic scorer (none is built from config)."""
    judge_model_path: Path | None = None
    """`exact_or_judge` and `execution` (problems without tests): a local Hugging Face causal LM
    asked whether the patch fixes the issue as the gold does; its P(yes) is the reward."""
    judge_device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$")
    judge_max_length: int = Field(2048, ge=64)
    """Tokens of judge prompt; the issue text is cut to fit (the patches and question are kept)."""
    time_limit_s: float = Field(5.0, gt=0)
    """`execution`: one wall-clock budget per patch: loading the repository and running its tests."""
    memory_mb: int = Field(256, ge=16)
    sandbox: Literal["auto", "bwrap", "process"] = "auto"
    """As the code reward's `sandbox`: `process` is NOT a security boundary."""
    sandbox_uid: int = Field(61000, ge=1)

    @model_validator(mode="after")
    def _fields_of_other_modes(self) -> SweReward:
        # By value, not by `model_fields_set`: a full `model_dump()` of a valid config must load.
        if self.mode != "similarity" and self.semantic_weight != 0.5:
            raise ValueError(f"semantic_weight is read only by mode 'similarity' (mode is {self.mode!r})")
        if self.mode == "similarity" and self.judge_model_path is not None:
            raise ValueError(
                "judge_model_path is read only by modes 'exact_or_judge' and 'execution' "
                "(mode is 'similarity')"
            )
        return self

    @property
    def heavy(self) -> bool:
        """Scoring runs the sandbox or a model (the reward service sends it to its workers)."""
        return self.mode == "execution" or self.judge_model_path is not None


class RlhfReward(StrictModel):
    """A sequence-classification reward model scoring the answer after the reasoning block."""

    kind: Literal["rlhf"] = "rlhf"
    model_path: Path
    """A local Hugging Face sequence-classification checkpoint (one output)."""
    shaping: Literal["none", "group_tanh"] = "none"
    """`group_tanh`: z-score each group's scores, then tanh (training only: evals are unshaped)."""
    baseline: Literal["none", "reference"] = "none"
    """`reference`: reward = sigmoid(score - score of the problem's reference answer), the
    Bradley-Terry probability that the response beats the reference (0.5 = as good); bounded
    in (0, 1), so evals read as a win rate. `none`: the raw (unbounded) score."""
    batch_size: int = Field(32, ge=1)
    max_length: int = Field(256, ge=8)


class AgentReward(StrictModel):
    """Task completion in the tool environment (`cascade.domains.agent`): the transcript is
    replayed (its tool responses must be the environment's), then the final answer and/or the
    final store are checked; function-call problems (`kind: hf`, `adapter: bfcl`) are matched
    structurally. Calls past a limit get an error response and are counted."""

    kind: Literal["agent"] = "agent"
    max_response_chars: int = Field(16_000, ge=1)
    """Longer final responses get `output_limit` unread (`cascade.domains.length_bound`)."""
    max_turns: int = Field(8, ge=1)
    """Model turns in an episode (the turn loop stops there; a longer transcript is not paid)."""
    reuse_kv: bool = True
    """The HF engine (embedded or the rollout service) keeps each round's keys/values and the
    next round prefills only the ids it has not processed (the environment's answer), instead
    of the episode's whole context; the same decisions in both modes, so they stay equal on a
    seed (`cascade.engine.prefix_kv`). Later rounds' log-probs then differ from a full prefill's
    at float rounding. vLLM reuses by its prefix caching either way."""
    max_calls_per_turn: int = Field(4, ge=1)
    max_calls_per_episode: int = Field(12, ge=1)
    max_repeated_calls: int = Field(2, ge=1)
    """The same call (name and arguments) made more often than this is a loop: reward 0."""
    max_call_chars: int = Field(512, ge=16)
    """A call's JSON text; longer is `oversized` (answered with an error, never parsed)."""
    chat_template_from: Path | None = None
    """A tokenizer directory whose chat template gives the tool-call format; None: the tiny
    model's (Qwen3's `<tool_call>`/`<tool_response>` convention)."""
    python_tool: bool = False
    """Offer the `python` tool (model-written code run in the code sandbox)."""
    time_limit_s: float = Field(2.0, gt=0)
    memory_mb: int = Field(256, ge=16)
    sandbox: Literal["auto", "bwrap", "process"] = "auto"
    """As the code reward's `sandbox`: `process` is NOT a security boundary."""
    sandbox_uid: int = Field(61000, ge=1)

    @property
    def heavy(self) -> bool:
        """Scoring runs the sandbox (the python tool): the reward service sends it to its workers."""
        return self.python_tool


RewardConfig = Annotated[
    MathReward | CodeReward | IfReward | SweReward | RlhfReward | AgentReward, Field(discriminator="kind")
]


# --------------------------------------------------------------------------- schedules


class ConstantSchedule(StrictModel):
    kind: Literal["constant"] = "constant"
    value: float = Field(..., ge=0)


class LinearSchedule(StrictModel):
    """Linear from `start` to `end` over `steps` stage steps, then held at `end`."""

    kind: Literal["linear"] = "linear"
    start: float = Field(..., ge=0)
    end: float = Field(..., ge=0)
    steps: int = Field(..., ge=1)


class CosineSchedule(StrictModel):
    """Half-cosine from `start` to `end` over `steps` stage steps, then held at `end`."""

    kind: Literal["cosine"] = "cosine"
    start: float = Field(..., ge=0)
    end: float = Field(..., ge=0)
    steps: int = Field(..., ge=1)


Schedule = Annotated[ConstantSchedule | LinearSchedule | CosineSchedule, Field(discriminator="kind")]


class TokenBudget(StrictModel):
    """Max new tokens, optionally growing within the stage (the paper's 24K -> 32K -> 40K)."""

    max_new_tokens: int = Field(..., ge=1)
    grow_to: list[int] = Field(default_factory=list)
    """Later budgets, each larger than the one before."""
    grow_every: int | None = Field(None, ge=1)
    """Stage steps between two growths; required when `grow_to` is set."""

    @model_validator(mode="after")
    def _check_growth(self) -> TokenBudget:
        prev = self.max_new_tokens
        for value in self.grow_to:
            if value <= prev:
                raise ValueError(f"grow_to must increase: {value} after {prev}")
            prev = value
        if self.grow_to and self.grow_every is None:
            raise ValueError("grow_every is required when grow_to is set")
        return self


# --------------------------------------------------------------------------- GRPO


class GrpoConfig(StrictModel):
    group_size: int = Field(8, ge=2)
    """Completions per prompt; advantages are normalised within each group."""
    prompts_per_step: int = Field(16, ge=1)
    learning_rate: float = Field(1e-4, gt=0, le=1.0)
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up at the start of the stage."""
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1.0)
    budget: TokenBudget = TokenBudget(max_new_tokens=32)
    loss_aggregation: Literal["token", "sequence"] = "token"
    """`token`: sum over the group's tokens / total tokens; `sequence`: mean of sequence means."""
    clip_eps_low: float = Field(0.2, ge=0, lt=1)
    clip_eps_high: float = Field(0.28, ge=0)
    max_staleness: int = Field(0, ge=0)
    """Policy versions a rollout may lag the learner; 0 = strictly on-policy."""
    kl_coef: float = Field(0.0, ge=0)
    """k3 KL penalty to the frozen stage-start policy; 0 disables it."""
    overlong: Literal["mask", "zero"] = "mask"
    """Completions cut by the token budget: drop from the loss (`mask`) or score 0 (`zero`)."""
    thinking: bool = False
    """Render prompts with the think flag instead of the no-think flag."""
    max_verifier_failure_fraction: float = Field(0.5, ge=0, le=1)
    """Largest share of a step's samples whose verifier failed (`infra_error`) that the step
    trains on. Such samples never count (advantage 0, out of their group's statistics), but a
    step past this bound learns from a biased remnant: it raises `VerifierFailureError` and the
    stage fails with the main causes. 1 never stops; 0 stops at the first failure."""


class FilterConfig(StrictModel):
    drop_zero_variance: bool = True
    """Drop groups whose rewards are all equal (their advantages are all 0)."""
    prompt_filter: bool = False
    """Epoch-level: stop sampling prompts that were always or never solved."""
    solved_threshold: float = Field(1.0, gt=0, le=1)
    unsolved_threshold: float = Field(0.0, ge=0, lt=1)
    readmit_prob: float = Field(0.05, ge=0, le=1)
    """Chance a filtered prompt is sampled again anyway (pass rates drift)."""
    min_attempts: int = Field(8, ge=1)
    """Samples seen before a prompt's pass rate is trusted."""


class DistillConfig(StrictModel):
    enabled: bool = True
    teachers: list[DomainName] | Literal["earlier"] = "earlier"
    """Teacher domains: explicit, or every domain trained in an earlier stage."""
    loss: Literal["full", "topk", "sampled"] = "sampled"
    topk: int = Field(16, ge=1)
    lam: Schedule = ConstantSchedule(value=1.0)
    """Weight of the distillation term; scheduled over stage steps."""
    temperature: float = Field(1.0, gt=0)
    prompt_source: Literal["replay", "current"] = "replay"
    """`replay`: prompts from the teacher's own domain; `current`: this stage's prompts."""
    prompts_per_teacher: int = Field(16, ge=1)
    samples_per_prompt: int = Field(1, ge=1)
    teacher_weights: dict[str, float] = Field(default_factory=dict)
    """Per-teacher weight w_d (default 1.0)."""


EVAL_METRIC_PATTERN = re.compile(r"^(greedy|avg@[1-9][0-9]*|pass@[1-9][0-9]*)$")


def metric_k(metric: str) -> int:
    """Samples a metric needs: 0 for `greedy`, k for `avg@k` / `pass@k`."""
    return 0 if metric == "greedy" else int(metric.split("@", 1)[1])


def parse_watched_metric(metric: str) -> tuple[str, str | None]:
    """`eval/<domain>[/<metric>]` -> (domain, metric or None for the eval's primary score)."""
    parts = metric.split("/")
    if len(parts) not in (2, 3) or parts[0] != "eval" or not parts[1]:
        raise ValueError(f"metric {metric!r} is not of the form eval/<domain>[/<metric>]")
    if len(parts) == 3 and not EVAL_METRIC_PATTERN.match(parts[2]):
        raise ValueError(f"metric {metric!r}: {parts[2]!r} is not greedy, avg@k or pass@k")
    return parts[1], parts[2] if len(parts) == 3 else None


class AdvanceRule(StrictModel):
    metric: str = "eval/{domain}"
    """Metric watched: `eval/<domain>` (that domain's primary eval score, the first of the stage's
    `eval.metrics`) or `eval/<domain>/<metric>` (e.g. `eval/{domain}/pass@4`); `{domain}` is the
    stage's domain. The metric must be one the stage's `eval.metrics` computes."""
    threshold: float = Field(1.0, ge=0)
    patience: int = Field(1, ge=1)
    """Consecutive evals at or above `threshold` needed to advance."""
    max_steps: int = Field(100, ge=1)
    min_steps: int = Field(0, ge=0)

    @field_validator("metric")
    @classmethod
    def _metric_form(cls, v: str) -> str:
        parse_watched_metric(v)
        return v


class EvalConfig(StrictModel):
    every: int = Field(10, ge=1)
    """Evaluate every configured domain every `every` stage steps (and at stage ends)."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Defaults to the stage's current token budget."""
    n_prompts: int | None = Field(None, ge=1)
    """Cap on eval prompts per domain (default: the whole eval split)."""
    metrics: list[str] = Field(default_factory=lambda: ["greedy"], min_length=1)
    """What to report: `greedy` (one greedy completion per prompt), `avg@k` (mean reward of the
    first k samples, i.e. pass@1 averaged over k), `pass@k` (unbiased estimator from all
    `samples`). The first is the eval's primary score: the regression table's and the teacher's."""
    samples: int = Field(1, ge=1)
    """Sampled completions per prompt for `avg@k` / `pass@k` (n >= every k)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the `samples` completions (greedy ignores it)."""
    top_p: float = Field(1.0, gt=0, le=1)
    pass_threshold: float = 1.0
    """A sampled completion passes (for pass@k) when its reward is at least this."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Level of every interval (Wilson for 0/1 outcomes, bootstrap over prompts otherwise)."""

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: list[str]) -> list[str]:
        for m in v:
            if not EVAL_METRIC_PATTERN.match(m):
                raise ValueError(f"unknown eval metric {m!r}: use greedy, avg@k or pass@k")
        if len(set(v)) != len(v):
            raise ValueError(f"eval metrics listed twice: {v}")
        return v

    @model_validator(mode="after")
    def _enough_samples(self) -> EvalConfig:
        k = max(metric_k(m) for m in self.metrics)
        if k > self.samples:
            raise ValueError(f"metric needing k={k} samples but eval.samples is {self.samples} (n >= k)")
        return self

    @property
    def primary(self) -> str:
        return self.metrics[0]


class DomainConfig(StrictModel):
    """A domain's data and reward, shared by every stage that trains or evaluates it."""

    name: DomainName
    prompts: PromptSource = SyntheticPrompts()
    reward: RewardConfig | None = None
    """Defaults to the domain's own reward kind with default settings."""

    @model_validator(mode="after")
    def _reward_matches(self) -> DomainConfig:
        if isinstance(self.prompts, HfPrompts):
            self.prompts.check_domain(self.name)
        if self.reward is not None and self.reward.kind != self.name:
            raise ValueError(f"reward kind {self.reward.kind!r} does not match domain {self.name!r}")
        if self.name == "rlhf" and self.reward is None:
            raise ValueError("the rlhf domain needs `reward: {kind: rlhf, model_path: ...}`")
        return self


class StageConfig(StrictModel):
    name: str | None = None
    domain: DomainName
    grpo: GrpoConfig = GrpoConfig()
    filter: FilterConfig = FilterConfig()
    distill: DistillConfig = DistillConfig()
    advance: AdvanceRule = AdvanceRule()
    eval: EvalConfig = EvalConfig()

    @property
    def label(self) -> str:
        return self.name or self.domain


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
    (`cascade.config_diff`): a run may resume with other bounds."""

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
    learner alike). Not a training setting in the config hash (`cascade.config_diff`): a run
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


class VllmEngineConfig(StrictModel):
    """Settings of the vLLM rollout engine (`cascade-rollout --engine vllm`). `None` means the
    platform's default, chosen when the engine starts: on vLLM's CPU build eager mode and a
    1 GiB KV cache (vLLM's own default reserves `gpu_memory_utilization` of the host's RAM);
    on a GPU CUDA graphs and `gpu_memory_utilization` of the GPU's memory."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations. `auto`: float32 on the CPU (what the learner computes in),
    bfloat16 on a GPU."""
    enforce_eager: bool | None = None
    """True: no torch.compile / CUDA graphs (starts ~30 s faster on CPU, slower per step on a
    GPU). Default: True on the CPU, False on a GPU."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """KV-cache size in GiB (vLLM's `kv_cache_memory_bytes`); overrides
    `gpu_memory_utilization`. Default: 1 on the CPU, unset on a GPU."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Share of the device's memory vLLM may take when `kv_cache_gib` is unset."""
    max_model_len: int | None = Field(None, ge=1)
    """Context (prompt + completion tokens) to serve; at most the model's
    `max_position_embeddings` (default: that)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs (or CPU worker processes) one replica is split over; must divide the model's
    attention heads and key/value heads."""
    seed: int = 0


class CascadeConfig(StrictModel):
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    model: ModelConfig
    chat: ChatConfig = ChatConfig()
    domains: list[DomainConfig] = Field(..., min_length=1)
    """Every domain evaluated throughout the cascade (the regression table's rows)."""
    stages: list[StageConfig] = Field(..., min_length=1)
    checkpoint: CheckpointConfig = CheckpointConfig()
    rollout: RolloutConfig = RolloutConfig()
    lease: LeaseConfig = LeaseConfig()
    learner: LearnerConfig = LearnerConfig()
    resilience: ResilienceConfig = ResilienceConfig()
    tracking: TrackingConfig = TrackingConfig()
    """Experiment trackers (TensorBoard, MLflow, W&B): none by default."""
    output_dir: Path = Path("runs")

    @model_validator(mode="after")
    def _check_domains(self) -> CascadeConfig:
        names = [d.name for d in self.domains]
        if len(set(names)) != len(names):
            raise ValueError(f"domains listed twice: {names}")
        for i, stage in enumerate(self.stages):
            if stage.domain not in names:
                raise ValueError(f"stages.{i}.domain {stage.domain!r} is not in domains {names}")
            teachers = stage.distill.teachers
            if isinstance(teachers, list):
                earlier = {s.domain for s in self.stages[:i]}
                for t in teachers:
                    if t not in earlier:
                        raise ValueError(
                            f"stages.{i}.distill.teachers: {t!r} is not trained in an earlier stage"
                        )
            domain, metric = parse_watched_metric(stage.advance.metric)
            if domain != "{domain}" and domain not in names:
                raise ValueError(f"stages.{i}.advance.metric: domain {domain!r} is not in domains {names}")
            if metric is not None and metric not in stage.eval.metrics:
                raise ValueError(
                    f"stages.{i}.advance.metric: {metric!r} is not in stages.{i}.eval.metrics "
                    f"{stage.eval.metrics}"
                )
            if stage.eval.primary != self.stages[0].eval.primary:
                raise ValueError(
                    f"stages.{i}.eval.metrics starts with {stage.eval.primary!r} but stage 0's with "
                    f"{self.stages[0].eval.primary!r}: the primary (first) eval metric is compared "
                    "across stages (regression table, teacher selection), so all stages share it"
                )
        labels = [s.label for s in self.stages]
        if len(set(labels)) != len(labels):
            raise ValueError(f"stage names must be unique (set `name`): {labels}")
        return self

    def domain(self, name: str) -> DomainConfig:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(name)

    def teachers_for(self, stage_index: int) -> list[str]:
        """Teacher domains for a stage: earlier stages' domains, without its own."""
        stage = self.stages[stage_index]
        if not stage.distill.enabled:
            return []
        if stage.distill.teachers == "earlier":
            seen: list[str] = []
            for s in self.stages[:stage_index]:
                if s.domain != stage.domain and s.domain not in seen:
                    seen.append(s.domain)
            return seen
        return [t for t in stage.distill.teachers if t != stage.domain]


def with_learner_device(cfg: CascadeConfig, device: str | None) -> CascadeConfig:
    """`cfg` with `learner.device` replaced (a `--device` flag); None leaves it as it is."""
    if device is None:
        return cfg
    learner = LearnerConfig(device=device, precision=cfg.learner.precision)
    return cfg.model_copy(update={"learner": learner})


def with_tracking(cfg: CascadeConfig, backends: list[BackendName] | None) -> CascadeConfig:
    """`cfg` with `tracking.backends` replaced (a `--track` flag); None leaves it as it is."""
    if backends is None:
        return cfg
    tracking = cfg.tracking.model_copy(update={"backends": list(backends)})
    return cfg.model_copy(update={"tracking": tracking})


def device_setting(value: str) -> str:
    """A `--device` value checked against `auto | cpu | cuda | cuda:N` (argparse `type=`)."""
    if not re.match(DEVICE_PATTERN, value):
        raise ValueError(f"{value!r} is not one of auto, cpu, cuda, cuda:N")
    return value


# --------------------------------------------------------------------------- loading


MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a config may have (a real one nests about 5 deep).
Checked while the text is parsed, before anything is built from it: a document nested
thousands deep is refused in microseconds, never a RecursionError."""


class NestingTooDeep(ValueError):
    """A document nested deeper than the bound; the message names the bound."""

    def __init__(self, max_depth: int, where: str = "") -> None:
        super().__init__(f"{where}nested deeper than {max_depth} levels (the bound on a config's nesting)")
        self.max_depth = max_depth


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last) and a
    document nested deeper than `max_depth` (PyYAML's composer recurses once per level)."""

    max_depth = MAX_DEPTH

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        collection = self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent)
        if collection:
            self._depth += 1
            if self._depth > self.max_depth:
                mark = self.peek_event().start_mark
                where = f"line {mark.line + 1}, column {mark.column + 1}: "
                raise NestingTooDeep(self.max_depth, where)
        try:
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        finally:
            if collection:
                self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_JSON_SIGNIFICANT = re.compile(r'[\[\]{}"]')
_JSON_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)


def check_json_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise `NestingTooDeep` if the JSON text nests deeper than `max_depth` (brackets inside
    strings do not count), before `json.loads` would recurse into it. One linear pass;
    malformed text is left to the parser."""
    depth = 0
    pos = 0
    while (match := _JSON_SIGNIFICANT.search(text, pos)) is not None:
        char = match.group(0)
        pos = match.end()
        if char == '"':
            rest = _JSON_STRING_REST.match(text, pos)
            if rest is None:
                return  # an unterminated string: json.loads says where
            pos = rest.end()
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                raise NestingTooDeep(max_depth, f"character {match.start() + 1}: ")
        else:
            depth -= 1


class ConfigError(Exception):
    """A config that cannot be used; the message is one line naming the field."""


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-after"))
    # Discriminated unions put the tag in the path (e.g. `reward.code.mode`); keep it, it helps.
    msg = first["msg"]
    value = first.get("input")
    shown = "" if isinstance(value, dict | list) or value is None else f" (got {value!r})"
    extra = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    where = loc or "<root>"
    return f"{source}: {where}: {msg}{shown}{extra}"


def parse_cascade_config(data: object, source: str = "config") -> CascadeConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: <root>: expected a mapping, got {type(data).__name__}")
    try:
        return CascadeConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def parse_domain_config(data: object, source: str = "domain") -> DomainConfig:
    """One domain's config on its own (the reward service gets them per request)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: <root>: expected a mapping, got {type(data).__name__}")
    try:
        return DomainConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def _load_yaml(text: str, max_depth: int) -> object:
    loader = _UniqueKeyLoader(text)
    loader.max_depth = max_depth
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_cascade_yaml(text: str, source: str = "config", *, max_depth: int = MAX_DEPTH) -> CascadeConfig:
    """A cascade from YAML text (the control plane receives configs this way): a key given
    twice is an error, as is nesting deeper than `max_depth` and anything the models refuse."""
    try:
        data = _load_yaml(text, max_depth)
    except NestingTooDeep as err:
        raise ConfigError(f"{source}: invalid YAML: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}: invalid YAML: {where}{problem}") from None
    except RecursionError:  # belt and braces: the depth bound should make this unreachable
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None
    return parse_cascade_config(data, source)


def parse_cascade_json(text: str, source: str = "config", *, max_depth: int = MAX_DEPTH) -> CascadeConfig:
    """A cascade from JSON text, with the same nesting bound as YAML."""
    try:
        check_json_depth(text, max_depth)
        data = json.loads(text)
    except NestingTooDeep as err:
        raise ConfigError(f"{source}: invalid JSON: {err}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid JSON: nested too deeply") from None
    except ValueError as err:
        raise ConfigError(f"{source}: invalid JSON: {err}") from None
    return parse_cascade_config(data, source)


def load_cascade_config(path: str | Path) -> CascadeConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    config = parse_cascade_yaml(text, str(path))
    if not config.model.path.is_absolute():
        base = path.parent
        # Relative model paths are relative to the working directory if they exist there,
        # else to the config file (so examples work from any directory).
        if not config.model.path.exists() and (base / config.model.path).exists():
            config = config.model_copy(
                update={"model": config.model.model_copy(update={"path": base / config.model.path})}
            )
    return config


def check_paths(cfg: CascadeConfig) -> list[str]:
    """What the config names on disk and is not there: one `field: problem` line per missing or
    wrong-kind path (empty when all is well). Relative paths are checked as the runner reads
    them: from the working directory (the model's also next to the config file, as
    `load_cascade_config` resolved it).

    Kept apart from the schema checks: the control plane validates configs for runners on
    other hosts (it need not hold the model); `cascade validate` and `cascade run` call both.
    """
    problems: list[str] = []

    def shown(path: Path) -> str:
        return str(path) if path.is_absolute() else f"{path} ({path.absolute()})"

    def model_dir(field: str, path: Path, hint: str = "") -> None:
        if not path.exists():
            problems.append(f"{field}: {shown(path)} does not exist{hint}")
        elif not (path / "config.json").is_file():
            problems.append(f"{field}: {shown(path)} is not a model directory (no config.json){hint}")

    model_dir("model.path", cfg.model.path, " (build the tiny one with `cascade model init`)")
    for i, domain in enumerate(cfg.domains):
        if isinstance(domain.prompts, JsonlPrompts):
            for name in ("train_path", "eval_path"):
                path = getattr(domain.prompts, name)
                if not path.exists():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} does not exist")
                elif not path.is_file():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} is not a file")
        if isinstance(domain.prompts, HfPrompts):
            sources = [("path", domain.prompts.path)] if domain.prompts.path is not None else []
            for split, files in (domain.prompts.data_files or {}).items():
                sources += [(f"data_files.{split}.{j}", f) for j, f in enumerate(files)]
            for name, path in sources:
                if path is not None and not path.exists():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} does not exist")
        if isinstance(domain.reward, RlhfReward):
            model_dir(f"domains.{i}.reward.model_path", domain.reward.model_path)
    if cfg.output_dir.exists() and not cfg.output_dir.is_dir():
        problems.append(f"output_dir: {shown(cfg.output_dir)} exists and is not a directory")
    return problems

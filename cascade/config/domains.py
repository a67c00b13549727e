"""A domain's section (`domains:`): where its prompts come from and how its reward is computed.

The `kind: hf` prompt source is `cascade.config.hf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from cascade.config.base import BUILTIN_DOMAINS, DomainName, StrictModel, VerifierKind
from cascade.config.hf import HfPrompts

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


class PythonReward(StrictModel):
    """A user's own reward function (`cascade.domains.custom`), loaded by import path and called
    once per completion in worker processes, each call within `time_limit_s`:

        def score(completion: str, answer: str, *, prompt: str, meta: dict, **options) -> float | dict

    returning the reward, or `{"reward": r, "reason": ..., "detail": ...}`. A call that raises,
    overruns or returns anything else is the function's failure: `infra_error` (masked out of
    training and evals), never a reward of 0. The reward service runs only functions its
    operator lists (`cascade-reward --python-reward`; `cascade up` lists the config's)."""

    kind: Literal["python"] = "python"
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """`package.module:function`, importable from `python_path` or the installed packages."""
    python_path: list[Path] = []
    """Directories put first on the import path of the workers that call the function."""
    options: dict[str, object] = {}
    """Keyword arguments passed to every call."""
    time_limit_s: float = Field(5.0, gt=0)
    pass_threshold: float = 1.0
    """A reward at least this is `ok` (counted as solved by the evals), below `wrong_answer`."""
    max_response_chars: int = Field(16_000, ge=1)
    """Longer responses get `output_limit` unread (`cascade.domains.length_bound`)."""
    workers: int = Field(2, ge=1)


RewardConfig = Annotated[
    MathReward | CodeReward | IfReward | SweReward | RlhfReward | AgentReward | PythonReward,
    Field(discriminator="kind"),
]

DEFAULT_REWARDS: dict[str, type[StrictModel]] = {
    "math": MathReward,
    "code": CodeReward,
    "if": IfReward,
    "swe": SweReward,
    "agent": AgentReward,
}
"""Each verifier kind's reward settings when a domain gives none (rlhf and python must)."""


class DomainConfig(StrictModel):
    """A domain's data and reward, shared by every stage that trains or evaluates it."""

    name: DomainName
    verifier: VerifierKind | None = None
    """The verifier that scores this domain (math, code, if, swe, rlhf, agent, or python: a
    function of your own, see `reward`). None: the reward's `kind`, else the domain's name,
    which must then be one of the built-in kinds. Two data sets of one kind are two domains
    (`gsm8k` and `math-hard`, both `verifier: math`): two rows of the regression table."""
    prompts: PromptSource = SyntheticPrompts()
    reward: RewardConfig | None = None
    """Defaults to the verifier kind's reward with default settings."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """The longest prompt of this domain once rendered (chat template and flags included), in
    tokens. Nothing is cut to it: it is what `cascade validate` adds to each stage's token
    budgets to check them against the model's context (`max_position_embeddings`), and what the
    learner's memory estimate takes a prompt to be. None: 32 (a short question)."""

    @property
    def kind(self) -> str:
        """The verifier kind (see `verifier`)."""
        if self.verifier is not None:
            return self.verifier
        if self.name in BUILTIN_DOMAINS:
            return self.name
        return self.reward.kind if self.reward is not None else self.name

    @property
    def reward_settings(self) -> RewardConfig | None:
        """`reward`, or the kind's defaults (None for a kind without defaults)."""
        if self.reward is not None:
            return self.reward
        default = DEFAULT_REWARDS.get(self.kind)
        return default() if default is not None else None  # type: ignore[return-value]

    @model_validator(mode="after")
    def _reward_matches(self) -> DomainConfig:
        kind = self.kind
        if kind not in BUILTIN_DOMAINS + ("python",):
            raise ValueError(
                f"domain {self.name!r} needs a verifier: set `verifier:` (or `reward.kind`) to one of "
                f"{', '.join(BUILTIN_DOMAINS)}, python"
            )
        if self.reward is not None and self.reward.kind != kind:
            raise ValueError(f"reward kind {self.reward.kind!r} does not match verifier {kind!r}")
        if isinstance(self.prompts, HfPrompts) and kind != "python":
            self.prompts.check_domain(kind)
        if kind == "rlhf" and self.reward is None:
            raise ValueError(f"domain {self.name!r} (rlhf) needs `reward: {{kind: rlhf, model_path: ...}}`")
        if kind == "python":
            if self.reward is None:
                raise ValueError(
                    f"domain {self.name!r} (python) needs `reward: {{kind: python, function: module:name}}`"
                )
        return self

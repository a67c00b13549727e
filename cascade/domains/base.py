"""What every domain provides: problems, a reference answer for SFT, and a verifier.

The same `score` is used for training rollouts and for eval (rewards live with their domain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cascade.domains.verdict_text import MAX_REASON_CHARS, verdict_text

# Reasons a verdict can carry. `infra_error` means the verifier itself failed: it is never a
# reward of 0 for the sample; the learner drops (or retries) such samples.
OK = "ok"
WRONG_ANSWER = "wrong_answer"
NO_ANSWER = "no_answer"
PARSE_ERROR = "parse_error"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
RUNTIME_ERROR = "runtime_error"
OUTPUT_LIMIT = "output_limit"
TRUNCATED = "truncated"
INFRA_ERROR = "infra_error"


@dataclass(frozen=True)
class Problem:
    """One prompt of a domain, with what its verifier needs."""

    id: str
    """Stable across runs: `<domain>-<split>-<index>` for synthetic data."""
    domain: str
    prompt: str
    """The user message (without chat template or thinking flag)."""
    answer: str
    """A correct response, used for supervised tuning and as the gold answer."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Verifier data (tests for code, rules for if, ...); JSON-serialisable."""


@dataclass(frozen=True)
class RewardVerdict:
    """A verifier's judgement of one completion: its reward and why.

    Built anywhere (a domain, the sandbox, a transport decoding a reply), its text is made
    safe on construction (`verdict_text`: valid UTF-8, no control characters but newline and
    tab, capped), so a detail quoting a hostile completion can always be encoded, stored and
    shown. A reward that is not a finite number is the verifier's failure, never a score: such
    a verdict becomes `infra_error` with reward 0.
    """

    reward: float
    reason: str
    detail: str = ""

    def __post_init__(self) -> None:
        reward, reason = float(self.reward), verdict_text(self.reason, MAX_REASON_CHARS)
        detail = verdict_text(self.detail)
        if not math.isfinite(reward):
            reason, detail = INFRA_ERROR, verdict_text(f"non-finite reward {reward} ({reason}): {detail}")
            reward = 0.0
        object.__setattr__(self, "reward", reward)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "detail", detail)

    @property
    def is_infra_error(self) -> bool:
        return self.reason == INFRA_ERROR


class Domain(Protocol):
    name: str

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` deterministic problems; `split` in {"train", "eval", "sft"} gives disjoint sets."""
        ...

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        """Score completions (text after the chat template, thinking block included)."""
        ...


@runtime_checkable
class EvalScoring(Protocol):
    """A domain whose eval score differs from its training reward (e.g. rlhf with per-group
    shaping, which is meaningless for an eval's one completion per problem)."""

    def eval_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]: ...


@runtime_checkable
class NeedsPreparing(Protocol):
    """A domain whose verifier needs the host (e.g. the code sandbox): `prepare()` makes it ready
    or raises saying what is missing, so a run fails at its start, not at its first score."""

    def prepare(self) -> None: ...


def score_for_eval(
    domain: Domain, problems: Sequence[Problem], completions: Sequence[str]
) -> list[RewardVerdict]:
    """The verdicts an eval records: `eval_batch` where the domain has one, else `score_batch`."""
    if isinstance(domain, EvalScoring):
        return domain.eval_batch(problems, completions)
    return domain.score_batch(problems, completions)

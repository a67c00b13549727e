"""A stage's evals (`eval:`) and the rule that advances it (`advance:`): the metrics and their form."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from cascade.config.base import StrictModel

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

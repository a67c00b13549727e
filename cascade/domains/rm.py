"""Reward-model verifier ("rlhf" domain): a learned scalar reward instead of a rule check.

`RewardModelScorer` loads a sequence-classification model with one output from a local
directory (nothing is downloaded) and scores the chat-rendered (prompt, response) pair, where
the response is only the text after the reasoning block (`strip_thinking`): what the model
thought never changes its reward. Scores are raw (unbounded) scalars.

`RlhfDomain.score_batch` turns scores into verdicts:

* `ok`: reward = the reward model's score (optionally shaped, see below);
* `no_answer`: nothing after the thinking block, or an unclosed `<think>`; reward = the lowest
  score among this batch's scored completions (so an empty answer is never better than any
  answered one), or -1.0 when the batch has no scored completion;
* `infra_error`: the reward model failed on the completion's mini-batch; reward 0.0, which
  the learner must not use as a reward (it drops or retries such samples).

Baseline (`baseline="reference"`): the reward is `sigmoid(score - reference score)`, where the
reference score is the reward model's score of the problem's reference answer (cached per
problem): the Bradley-Terry probability that the response beats the reference, in (0, 1), 0.5
when it is as good. `no_answer` is then 0.0, and a failure to score the reference is an
`infra_error` of the completions that needed it.

Shaping (`shaping="group_tanh"`): the rewards of each group (a run of consecutive completions
of the same problem id, as the rollout engine lays out a GRPO group) are z-scored and squashed
with tanh (`shape_group`); infra errors are left out of the group statistics. Shaping is a
training signal, not a score: `eval_batch` (what evals call) is `score_batch` without it, since
an eval has one completion per problem and a shaped group of one is always 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from cascade.domains.base import INFRA_ERROR, NO_ANSWER, OK, Problem, RewardVerdict
from cascade.domains.common import LruCache
from cascade.domains.rlhf_preferences import make_rlhf_problems
from cascade.model.chat import strip_thinking
from cascade.model.reward_model import format_rm_input

Shaping = Literal["none", "group_tanh"]
Baseline = Literal["none", "reference"]

SHAPE_EPS = 1e-6
"""A group whose (population) standard deviation is at most this is treated as all-equal."""

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)

NO_ANSWER_FALLBACK = -1.0
"""`no_answer` reward when the batch holds no scored completion to take the minimum of."""


def shape_group(scores: Sequence[float], group_size: int) -> list[float]:
    """Per group of `group_size` consecutive scores: `tanh((x - mean) / std)`.

    `std` is the population standard deviation of the group. A group with `std <= SHAPE_EPS`
    (all scores equal, or a group of one) gets zeros: no preference inside it. Results lie
    in (-1, 1) and sum to about 0 per group.
    """
    if group_size <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    if len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group_size}")
    shaped: list[float] = []
    for start in range(0, len(scores), group_size):
        group = [float(s) for s in scores[start : start + group_size]]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((s - mean) ** 2 for s in group) / len(group))
        if std <= SHAPE_EPS:
            shaped.extend(0.0 for _ in group)
        else:
            shaped.extend(math.tanh((s - mean) / std) for s in group)
    return shaped


def final_response(completion: str) -> tuple[str, str]:
    """(text after the reasoning block, "" or why there is no answer)."""
    if "<think>" in _THINK_BLOCK.sub("", completion):
        return "", "unclosed <think> block"
    response = strip_thinking(completion)
    if not response:
        return "", "empty response after thinking"
    return response, ""


class RewardModelScorer:
    """A local sequence-classification reward model (one label) that returns raw scores."""

    def __init__(
        self,
        path: Path | str,
        *,
        batch_size: int = 32,
        max_length: int = 256,
        shaping: Shaping = "none",
        device: str = "cpu",
    ) -> None:
        if batch_size <= 0 or max_length <= 0:
            raise ValueError("batch_size and max_length must be positive")
        if shaping not in ("none", "group_tanh"):
            raise ValueError(f"unknown shaping {shaping!r}; expected 'none' or 'group_tanh'")
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"reward model directory {self.path} does not exist")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                str(self.path), local_files_only=True
            )
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"cannot load a reward model from {self.path}: {err}") from err
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"reward model at {self.path} has {self.model.config.num_labels} labels; expected 1"
            )
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"reward model tokenizer at {self.path} has no pad token")
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        # Right padding keeps positions of the real tokens at 0..n-1 whatever the batch; the
        # model reads the reward at the last non-pad token. Truncation keeps the end (response).
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        self.batch_size = batch_size
        self.max_length = max_length
        self.shaping: Shaping = shaping
        self.device = torch.device(device)
        self.model.to(self.device)
        self.model.eval()

    @torch.no_grad()
    def score_chunk(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """Raw scores of one mini-batch (raises on model failure)."""
        texts = [format_rm_input(self.tokenizer, p, r) for p, r in zip(prompts, responses, strict=True)]
        enc = self.tokenizer(
            texts,
            add_special_tokens=False,
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        logits = self.model(
            input_ids=enc["input_ids"].to(self.device), attention_mask=enc["attention_mask"].to(self.device)
        ).logits
        scores = [float(x) for x in logits[:, 0].float().cpu()]
        if not all(math.isfinite(s) for s in scores):
            raise FloatingPointError("reward model returned a non-finite score")
        return scores

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """Raw scores of (prompt, final response) pairs; `responses` must already be stripped."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        out: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            end = start + self.batch_size
            out.extend(self.score_chunk(prompts[start:end], responses[start:end]))
        return out


class RlhfDomain:
    """The "rlhf" domain: synthetic polite-reply prompts scored by a reward model."""

    name = "rlhf"

    def __init__(self, scorer: RewardModelScorer, *, baseline: Baseline = "none") -> None:
        if baseline not in ("none", "reference"):
            raise ValueError(f"unknown baseline {baseline!r}; expected 'none' or 'reference'")
        self.scorer = scorer
        self.baseline: Baseline = baseline
        self._reference_cache: LruCache[tuple[str, str], float] = LruCache(4096)

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return make_rlhf_problems(split, n, seed)

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        """Training rewards: scored, baselined, then shaped per group (see the module docstring)."""
        return self._score(problems, completions, shape=self.scorer.shaping == "group_tanh")

    def eval_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        """Eval scores: `score_batch` without group shaping."""
        return self._score(problems, completions, shape=False)

    def _reference_scores(self, problems: Sequence[Problem]) -> dict[tuple[str, str], float]:
        """Reward-model scores of the problems' reference answers (raises on model failure)."""
        keys = list(dict.fromkeys((p.prompt, p.answer) for p in problems))
        out: dict[tuple[str, str], float] = {}
        todo = []
        for key in keys:
            cached = self._reference_cache.get(key)
            if cached is None:
                todo.append(key)
            else:
                out[key] = cached
        for start in range(0, len(todo), self.scorer.batch_size):
            chunk = todo[start : start + self.scorer.batch_size]
            scores = self.scorer.score_chunk([k[0] for k in chunk], [k[1] for k in chunk])
            for key, score in zip(chunk, scores, strict=True):
                self._reference_cache.put(key, score)
                out[key] = score
        return out

    def _score(
        self, problems: Sequence[Problem], completions: Sequence[str], *, shape: bool
    ) -> list[RewardVerdict]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        n = len(problems)
        rewards: list[float | None] = [None] * n
        reasons = [OK] * n
        details = [""] * n
        todo: list[int] = []
        for i, completion in enumerate(completions):
            response, why = final_response(completion)
            if why:
                reasons[i], details[i] = NO_ANSWER, why
            else:
                todo.append(i)
        bs = self.scorer.batch_size
        for start in range(0, len(todo), bs):
            idx = todo[start : start + bs]
            try:
                scores = self.scorer.score_chunk(
                    [problems[i].prompt for i in idx], [strip_thinking(completions[i]) for i in idx]
                )
            except Exception as err:  # any model failure is an infra error
                for i in idx:
                    reasons[i], details[i] = INFRA_ERROR, f"reward model failed: {type(err).__name__}: {err}"
                continue
            for i, s in zip(idx, scores, strict=True):
                rewards[i] = s
        if self.baseline == "reference":
            self._apply_reference(problems, rewards, reasons, details)
        scored = [r for r, why in zip(rewards, reasons, strict=True) if why == OK and r is not None]
        if self.baseline == "reference":
            floor = 0.0
        else:
            floor = min(scored) if scored else NO_ANSWER_FALLBACK
        values = [
            floor if reasons[i] == NO_ANSWER else (rewards[i] if reasons[i] == OK else None) for i in range(n)
        ]
        if shape:
            values = self._shape(problems, values)
        return [
            RewardVerdict(0.0 if v is None else float(v), reasons[i], details[i])
            for i, v in enumerate(values)
        ]

    def _apply_reference(
        self,
        problems: Sequence[Problem],
        rewards: list[float | None],
        reasons: list[str],
        details: list[str],
    ) -> None:
        """In place: each scored reward becomes sigmoid(score - reference score)."""
        idx = [i for i, r in enumerate(rewards) if reasons[i] == OK and r is not None]
        try:
            refs = self._reference_scores([problems[i] for i in idx])
        except Exception as err:  # the reference could not be scored: not the completion's fault
            for i in idx:
                rewards[i] = None
                reasons[i], details[i] = INFRA_ERROR, f"reference score failed: {type(err).__name__}: {err}"
            return
        for i in idx:
            score = rewards[i]
            assert score is not None
            margin = score - refs[(problems[i].prompt, problems[i].answer)]
            rewards[i] = 1.0 / (1.0 + math.exp(-max(min(margin, 60.0), -60.0)))

    @staticmethod
    def _shape(problems: Sequence[Problem], values: list[float | None]) -> list[float | None]:
        """`shape_group` over each run of consecutive completions of one problem (infra errors skipped)."""
        out = list(values)
        start = 0
        while start < len(problems):
            end = start
            while end < len(problems) and problems[end].id == problems[start].id:
                end += 1
            members = [(i, v) for i in range(start, end) if (v := values[i]) is not None]
            if members:
                shaped = shape_group([v for _, v in members], len(members))
                for (i, _), s in zip(members, shaped, strict=True):
                    out[i] = s
            start = end
        return out

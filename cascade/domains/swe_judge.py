"""Judges of a patch that is not the gold one: the only partial credit of the execution-free reward.

`PatchJudge.judge(issue, gold, patch)` returns the probability in [0, 1] that `patch` fixes the
issue as the gold patch does. `HfPatchJudge` asks a local Hugging Face causal LM a yes/no
question and reads its next-token distribution:

    P = p(" yes") / (p(" yes") + p(" no"))

where p(w) is the model's probability of the whole continuation w (all its tokens: a small
tokenizer may split " yes" and " no" into pieces that share a first token) after the prompt
below. The issue text is cut from its end to fit
`max_length` tokens; the two patches and the question are always kept whole (the SWE reward
caps the patch's length before it reaches a judge).

A judge is only as good as its model: a policy trained against it is optimised to convince it,
so use a model much stronger than the policy, and keep `execution` wherever there are tests.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol, runtime_checkable

_QUESTION = (
    "\n\nReference fix:\n{gold}\n\nCandidate patch:\n{patch}\n\n"
    "Does the candidate patch fix the issue as the reference fix does? Answer yes or no.\nAnswer:"
)
_YES, _NO = " yes", " no"


class JudgeInputTooLong(ValueError):
    """The patches and the question alone are longer than the judge reads (a verdict of 0 on the
    completion, not a failure of the judge)."""


@runtime_checkable
class PatchJudge(Protocol):
    """P(the patch fixes the issue as the gold patch does), in [0, 1]."""

    def judge(self, issue: str, gold: str, patch: str) -> float: ...


class HfPatchJudge:
    """A local causal LM's P(yes) to "does the candidate patch fix the issue?" (module docstring)."""

    def __init__(self, path: Path | str, *, device: str = "cpu", max_length: int = 2048) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"judge model directory {self.path} does not exist")
        if max_length < 64:
            raise ValueError(f"max_length must be >= 64, got {max_length}")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(str(self.path), local_files_only=True)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"cannot load a judge model from {self.path}: {err}") from err
        self.device = torch.device(device)
        self.model.to(self.device)  # type: ignore[arg-type]
        self.model.eval()
        self.max_length = max_length
        self.yes_ids = list(self.tokenizer(_YES, add_special_tokens=False)["input_ids"])
        self.no_ids = list(self.tokenizer(_NO, add_special_tokens=False)["input_ids"])
        if not self.yes_ids or not self.no_ids or self.yes_ids == self.no_ids:
            raise ValueError(f"judge tokenizer at {self.path} cannot tell {_YES!r} from {_NO!r}")

    def prompt_ids(self, issue: str, gold: str, patch: str) -> list[int]:
        """The prompt's token ids: the issue cut from its end so that the prompt and the longer
        answer fit `max_length`; JudgeInputTooLong when the patches alone do not."""
        head = list(self.tokenizer("Issue:\n", add_special_tokens=False)["input_ids"])
        tail = list(
            self.tokenizer(_QUESTION.format(gold=gold, patch=patch), add_special_tokens=False)["input_ids"]
        )
        answer = max(len(self.yes_ids), len(self.no_ids))
        room = self.max_length - len(head) - len(tail) - answer
        if room < 0:
            raise JudgeInputTooLong(
                f"judge prompt without the issue is {len(head) + len(tail) + answer} tokens "
                f"(max {self.max_length})"
            )
        body = list(self.tokenizer(issue, add_special_tokens=False)["input_ids"])[:room]
        return head + body + tail

    def judge(self, issue: str, gold: str, patch: str) -> float:
        prompt = self.prompt_ids(issue, gold, patch)
        yes, no = self._log_prob(prompt, self.yes_ids), self._log_prob(prompt, self.no_ids)
        d = yes - no  # p(yes) / (p(yes) + p(no)) = sigmoid(d), computed without overflow
        return 1.0 / (1.0 + math.exp(-d)) if d >= 0 else math.exp(d) / (1.0 + math.exp(d))

    def _log_prob(self, prompt: list[int], continuation: list[int]) -> float:
        """log p(continuation | prompt) under the model."""
        import torch

        ids = torch.tensor([prompt + continuation], device=self.device)
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor(continuation, device=self.device)
        return float(log_probs.gather(1, targets[:, None]).sum())

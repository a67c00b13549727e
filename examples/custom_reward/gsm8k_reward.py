"""A reward function of your own, as `verifier: python` calls it (examples/custom-reward.yaml).

GSM8K-style scoring: the last number of the response against the gold answer's number (the
`gsm8k` adapter turns `#### 72` into `\\boxed{72}`), with a small bonus for boxing it. Any module
importable from `python_path` works; the function gets the response after the reasoning block,
the problem's answer, and keyword arguments (the prompt, the problem's meta, the config's
`options`), and returns a number or a mapping with `reward` (and optionally `reason`, `detail`).
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def score(completion: str, answer: str, *, prompt: str, meta: dict[str, Any], box_bonus: float = 0.0) -> dict:
    gold = _last_number(answer)
    if gold is None:
        raise ValueError(f"the gold answer {answer!r} has no number")  # the data's fault: infra_error
    boxed = re.search(r"\\boxed\{([^{}]*)\}", completion)
    got = _last_number(boxed.group(1) if boxed else completion)
    if got is None:
        return {"reward": 0.0, "reason": "no_answer", "detail": "no number in the response"}
    right = abs(got - gold) < 1e-9
    reward = (1.0 if right else 0.0) + (box_bonus if boxed else 0.0)
    reason = "ok" if right else "wrong_answer"
    return {"reward": min(reward, 1.0), "reason": reason, "detail": f"{got:g} vs {gold:g}"}

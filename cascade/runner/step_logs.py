"""The run directory's per-step logs, appended in each step's fenced transaction.

- `samples.jsonl`: the sample ids each step trained on (what a resume must not train twice);
- `completions.jsonl`: a few of each step's completions as text, with their reward and verdict
  (what a person reads to see what the policy writes; the dashboard shows the latest).

A resume keeps the lines up to its checkpoint's step (the steps after it are redone); a cut last
line (a disk that filled during an append) is dropped, any other line that does not read stops
the resume with the file and line named.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cascade.rollout.requests import RolloutBatch
from cascade.runner.run_state import RunDirError

SAMPLES_LOG = "samples.jsonl"
COMPLETIONS_LOG = "completions.jsonl"
STEP_LOGS = (SAMPLES_LOG, COMPLETIONS_LOG)
COMPLETION_GROUPS = 2
"""Groups per step whose best and worst completions `completions.jsonl` keeps."""
PROMPT_CHARS = 600
COMPLETION_CHARS = 4000


def lines_to_keep(path: Path, global_step: int, log: Callable[[str], None]) -> list[str] | None:
    """`path`'s lines up to `global_step` (module docstring); None when the file does not exist."""
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    kept: list[str] = []
    for number, line in enumerate(lines, start=1):
        try:
            step = json.loads(line)["global_step"]
            if not isinstance(step, int):
                raise TypeError(f"global_step is {step!r}")
        except (ValueError, KeyError, TypeError) as err:
            if number < len(lines):
                raise RunDirError(
                    f"{path}:{number}: not a line of the {path.stem} log ({err}); only a cut last line "
                    "is repaired: fix or remove that line, then resume"
                ) from None
            log(f"{path}: dropped its last line, cut short ({len(line.encode())} bytes that do not read)")
            break
        if step <= global_step:
            kept.append(line)
    return kept


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def completion_records(
    batch: RolloutBatch, global_step: int, stage: str, groups: int, prompts: list[str]
) -> list[dict[str, Any]]:
    """The best and the worst completion (by reward) of the step's first `groups` groups, as
    `completions.jsonl` records (`prompts[i]` is the text of problem i)."""
    records: list[dict[str, Any]] = []
    size = batch.group_size
    for g in range(min(groups, batch.n_groups)):
        members = range(g * size, (g + 1) * size)
        by_reward = sorted(members, key=lambda i: batch.verdicts[i].reward)
        for i in dict.fromkeys((by_reward[-1], by_reward[0])):
            verdict = batch.verdicts[i]
            records.append(
                {
                    "global_step": global_step,
                    "stage": stage,
                    "domain": batch.problems[g].domain,
                    "problem": batch.problems[g].id,
                    "prompt": _cut(prompts[g], PROMPT_CHARS),
                    "completion": _cut(batch.texts[i], COMPLETION_CHARS),
                    "reward": verdict.reward,
                    "reason": verdict.reason,
                    "detail": _cut(verdict.detail, 300),
                    "finish": batch.finish_reasons[i],
                    "tokens": len(batch.completion_ids[i]),
                }
            )
    return records


def read_completions(run_dir: Path, last: int = 20) -> list[dict[str, Any]]:
    """The last `last` records of a run's completions log (lines that do not read are skipped)."""
    path = run_dir / COMPLETIONS_LOG
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    for line in path.read_text(errors="replace").splitlines()[-last:]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records

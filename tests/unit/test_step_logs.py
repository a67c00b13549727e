"""What a run shows while it trains: a line per step when not on a terminal, and the step's
completions kept as text (`runner/progress.py`, `runner/step_logs.py`)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from cascade.domains.base import Problem, RewardVerdict
from cascade.rollout.requests import RolloutBatch
from cascade.runner.progress import RunProgress, step_line
from cascade.runner.run_state import RunDirError
from cascade.runner.step_logs import completion_records, lines_to_keep, read_completions

METRICS = {"reward_mean": 0.4125, "kl": 0.00123, "completion_tokens_mean": 23.4, "time_step_s": 1.234}


def test_a_step_line_by_hand() -> None:
    line = step_line("math", 3, 30, {**METRICS, "reasons": {"ok": 3}}, "math 45%")
    assert line == "stage math step 3/30  reward 0.412  kl 0.0012  len 23  s/step 1.23  | eval math 45%"


def _progress(bars: bool, terminal: bool) -> tuple[RunProgress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=200)
    return RunProgress(console=console, bars=bars), out


@pytest.mark.parametrize(("bars", "terminal"), [(True, False), (False, True), (False, False)])
def test_a_line_per_step_when_piped_or_asked(bars: bool, terminal: bool) -> None:
    progress, out = _progress(bars, terminal)
    progress.start_stage(0, "math[low-high]", 30, 0)
    for step in (1, 2):
        progress.update(step, METRICS)
    progress.end_stage()
    lines = out.getvalue().splitlines()
    assert lines == [step_line("math[low-high]", s, 30, METRICS) for s in (1, 2)]


def test_bars_on_a_terminal_and_nothing_when_disabled() -> None:
    progress, _ = _progress(bars=True, terminal=True)
    assert progress.bars
    quiet = RunProgress(enabled=False, console=Console(file=io.StringIO()))
    quiet.start_stage(0, "math", 3, 0)
    quiet.update(1, METRICS)
    assert quiet.console.file.getvalue() == ""  # type: ignore[attr-defined]


def _batch() -> RolloutBatch:
    problems = [Problem(f"math/{i}", "math", f"prompt {i}" * (1 if i else 200), "1") for i in range(3)]
    rewards = [0.0, 1.0, 0.5, 0.5, 0.2, 0.9]
    return RolloutBatch(
        domain="math",
        problems=problems,
        group_size=2,
        prompt_ids=[[1]] * 6,
        completion_ids=[[1] * (i + 1) for i in range(6)],
        logprobs=[[0.0]] * 6,
        finish_reasons=["stop", "length", "stop", "stop", "stop", "stop"],
        texts=[f"answer {i}" for i in range(6)],
        verdicts=[
            RewardVerdict(r, "ok" if r == 1.0 else "wrong_answer", f"d{i}") for i, r in enumerate(rewards)
        ],
        policy_version=3,
        temperature=1.0,
    )


def test_the_best_and_the_worst_of_the_first_groups() -> None:
    batch = _batch()
    records = completion_records(batch, 7, "math", 2, [p.prompt for p in batch.problems])
    assert [(r["problem"], r["completion"], r["reward"]) for r in records] == [
        ("math/0", "answer 1", 1.0),
        ("math/0", "answer 0", 0.0),
        ("math/1", "answer 3", 0.5),  # a tie: the two ends are still two samples
        ("math/1", "answer 2", 0.5),
    ]
    assert records[0]["finish"] == "length" and records[0]["tokens"] == 2
    assert records[0]["prompt"].endswith("more characters]") and len(records[0]["prompt"]) < 700
    assert {r["global_step"] for r in records} == {7} and {r["stage"] for r in records} == {"math"}


def test_a_resume_keeps_the_lines_up_to_its_step_and_repairs_only_a_cut_last_line(tmp_path: Path) -> None:
    log = tmp_path / "completions.jsonl"
    assert lines_to_keep(log, 3, print) is None
    lines = [json.dumps({"global_step": s, "completion": "x"}) for s in (1, 2, 2, 3, 4)]
    log.write_text("\n".join(lines) + '\n{"global_step": 5, "compl')
    said: list[str] = []
    assert lines_to_keep(log, 3, said.append) == lines[:4]
    assert said and "dropped its last line" in said[0]
    log.write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    with pytest.raises(RunDirError, match=r"completions.jsonl:2: not a line of the completions log"):
        lines_to_keep(log, 3, print)
    assert [r["global_step"] for r in read_completions(tmp_path, last=2)] == [2]

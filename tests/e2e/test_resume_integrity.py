"""Resuming a real run on the random tiny model from damaged state (issue 34): a damaged newest
checkpoint is skipped for the one before it, a cut last line of `samples.jsonl` is repaired, a
bad line before it stops the resume before anything is changed, and a checkpoint the disk
refuses ends the run in one line and the resume command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from safetensors import SafetensorError

from cascade.cli.main import main as cli_main
from cascade.runner import checkpoint
from cascade.runner.embedded import RunDirError
from cascade.runner.loop import SAMPLES_LOG
from cascade.runner.step_logs import COMPLETIONS_LOG

STEPS = 6


def _short(data: dict[str, Any]) -> None:
    """One stage of `STEPS` steps on `if`, a checkpoint every 2, no eval but the first and last."""
    data["domains"] = data["domains"][:1]
    data["stages"] = data["stages"][:1]
    stage = data["stages"][0]
    stage["advance"] = {"max_steps": STEPS}
    stage["eval"] = {"every": 100, "n_prompts": 2}
    stage["grpo"].update(group_size=2, prompts_per_step=2)


@pytest.fixture(scope="module")
def stopped(e2e, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after 4 steps: checkpoints step-000002 and step-000004 (copied, never resumed)."""
    cfg = e2e.config(tmp_path_factory.mktemp("stopped"), _short)
    first = e2e.run(cfg, stop_after_steps=4)
    assert first.result.stopped_by == "interrupted"
    run_dir = cfg.output_dir / cfg.name
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    return run_dir


@pytest.fixture
def run_dir(stopped: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    return out


def _resume(e2e, run_dir: Path) -> list[str]:
    cfg = e2e.config(run_dir.parent / "cfg", _short)
    second = e2e.run(cfg, run_dir=run_dir, resume=True)
    assert second.result.stopped_by == "completed"
    return second.lines


def _trained_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["global_step"] for line in (run_dir / SAMPLES_LOG).read_text().splitlines()]


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before(e2e, run_dir: Path) -> None:
    model = run_dir / "checkpoints" / "step-000004" / "model.safetensors"
    size = model.stat().st_size
    with model.open("r+b") as f:
        f.truncate(size - 1000)
    lines = _resume(e2e, run_dir)
    assert (
        f"step-000004: model.safetensors is {size - 1000:,} bytes, manifest says {size:,}: skipped; "
        "resuming from step-000002"
    ) in lines
    assert any("resumed from step-000002" in line for line in lines)
    rows = e2e.rows(e2e.sqlite_url(run_dir))
    assert rows.run_status == "completed"
    assert [g for _, _, g, _ in rows.steps] == list(range(1, STEPS + 1))  # steps 3 and 4 redone, once
    assert _trained_steps(run_dir) == list(range(1, STEPS + 1))


def test_a_cut_last_line_of_the_samples_log_is_repaired(e2e, run_dir: Path) -> None:
    log = run_dir / SAMPLES_LOG
    with log.open("a") as f:
        f.write('{"global_step": 5, "sample_ids": ["if/3#0", "if/')  # the disk filled here
    lines = _resume(e2e, run_dir)
    assert any(line.startswith(f"{log}: dropped its last line, cut short (") for line in lines)
    assert _trained_steps(run_dir) == list(range(1, STEPS + 1))
    assert not log.with_name(log.name + ".tmp").exists()


def test_the_completions_log_is_cut_back_with_the_steps_a_resume_redoes(e2e, run_dir: Path) -> None:
    """Resumed from step-000002: steps 3 and 4 are trained again, their completions written once."""
    shutil.rmtree(run_dir / "checkpoints" / "step-000004")
    log = run_dir / COMPLETIONS_LOG
    with log.open("a") as f:
        f.write('{"global_step": 4, "completion": "cut')
    _resume(e2e, run_dir)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r["global_step"] for r in records]
    # the best and the worst completion of each of the step's two groups of two
    assert steps == [s for s in range(1, STEPS + 1) for _ in range(4)]
    assert all(r["domain"] == "if" and r["reason"] and isinstance(r["completion"], str) for r in records)
    assert all(r["problem"].startswith("if") and r["finish"] in ("stop", "length") for r in records)


def test_a_bad_line_before_the_last_stops_the_resume_before_any_change(e2e, run_dir: Path) -> None:
    """Resuming from step-000002 would drop the rows of steps 3 and 4: a samples log that does
    not read is found first, and the store's rows and the log stay as they were."""
    shutil.rmtree(run_dir / "checkpoints" / "step-000004")
    log = run_dir / SAMPLES_LOG
    text = log.read_text().splitlines()
    text[1] = text[1][: len(text[1]) // 2]
    log.write_text("".join(f"{line}\n" for line in text))
    before = e2e.rows(e2e.sqlite_url(run_dir))
    assert [g for _, _, g, _ in before.steps] == [1, 2, 3, 4]
    with pytest.raises(RunDirError) as err:
        _resume(e2e, run_dir)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{log}:2: not a line of the samples log (")
    after = e2e.rows(e2e.sqlite_url(run_dir))
    assert after.steps == before.steps and after.run_status == before.run_status
    assert log.read_text().splitlines() == text


def test_a_checkpoint_on_a_full_disk_ends_in_one_line_and_the_resume_command(
    e2e, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = e2e.config(tmp_path, _short)
    path = tmp_path / "cascade.yaml"
    run_dir = cfg.output_dir / cfg.name
    real, calls = checkpoint.save_file, []

    def fills_up(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) > 2:  # the second checkpoint (optimizer, then RNG state, per checkpoint)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", fills_up)
    assert cli_main(["run", str(path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"error: the run stopped: CheckpointWriteError: {run_dir / 'checkpoints' / 'step-000004'} "
        "could not be written: No space left on device; "
    ) in err
    assert f"continue with (once that is fixed): cascade run {path} --resume --run-dir {run_dir}" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002"]
    monkeypatch.setattr(checkpoint, "save_file", real)  # space freed: the command continues the run
    assert cli_main(["run", str(path), "--resume", "--run-dir", str(run_dir), "--no-progress"]) == 0
    assert _trained_steps(run_dir) == list(range(1, STEPS + 1))

"""Experiment tracking read back with each library's own reader, after a run that was stopped
and resumed: TensorBoard's `EventAccumulator`, `MlflowClient` on the run directory's SQLite
store, and W&B's offline transaction logs (`run-<id>.wandb`) through `wandb leet inspect --json`,
the reader wandb ships for them (offline runs have no `wandb.Api`).

One tiny cascade (random tiny model, if -> math, 2 steps each) logs to all three backends,
stops after 3 steps (`stop_after_steps`) and is resumed to the end; the resumed process must
continue the same tracked runs with the global steps contiguous and none twice. W&B never
leaves the host: offline mode, nothing but loopback is reachable here anyway.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cascade.config import CascadeConfig, parse_cascade_config
from cascade.runner.embedded import embedded_runner
from cascade.tracking import STATE_FILE, TrackingUnavailable

STEPS = [1, 2, 3, 4]
"""The run's global steps: 2 in stage `if`, 2 in stage `math`; stopped after 3."""
EVAL_STEPS = [0, 2, 4]


def _config(root: Path, model: Path, backends: list[str]) -> CascadeConfig:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 16, "n_eval": 4}
    grpo = {"group_size": 2, "prompts_per_step": 2, "budget": {"max_new_tokens": 8}}
    evals = {"every": 2, "metrics": ["greedy", "pass@2"], "samples": 2}
    return parse_cascade_config(
        {
            "name": "tracked",
            "model": {"path": str(model)},
            "domains": [{"name": "if", "prompts": prompts}, {"name": "math", "prompts": prompts}],
            "stages": [
                {"domain": "if", "grpo": grpo, "advance": {"max_steps": 2}, "eval": evals},
                {"domain": "math", "grpo": grpo, "advance": {"max_steps": 2}, "eval": evals},
            ],
            "checkpoint": {"every": 2},
            "output_dir": str(root / "runs"),
            "tracking": {"backends": backends},
        }
    )


@dataclass
class TrackedRun:
    run_dir: Path
    state_after_stop: dict[str, Any]
    """`tracking.json` when the first process stopped."""
    lines: list[str]


@pytest.fixture(scope="module")
def offline_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield


@pytest.fixture(scope="module")
def tracked(
    tmp_path_factory: pytest.TempPathFactory,
    random_tiny_model: Path,
    torch_one_thread: None,
    offline_env: None,
) -> TrackedRun:
    root = tmp_path_factory.mktemp("tracked")
    cfg = _config(root, random_tiny_model, ["tensorboard", "mlflow", "wandb"])
    run_dir = root / "run"
    lines: list[str] = []
    first = embedded_runner(cfg, run_dir=run_dir, log=lines.append, stop_after_steps=3).run()
    assert first.stopped_by == "interrupted"
    state = json.loads((run_dir / STATE_FILE).read_text())
    second = embedded_runner(cfg, run_dir=run_dir, log=lines.append, resume=True).run()
    assert second.stopped_by == "completed"
    return TrackedRun(run_dir, state, lines)


# ---------------------------------------------------------------------------------- TensorBoard


def test_tensorboard_event_files_read_back(tracked: TrackedRun) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tracked.run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    tags = ea.Tags()
    assert [e.step for e in ea.Scalars("train/reward_mean")] == STEPS
    assert [e.step for e in ea.Scalars("train/lr")] == STEPS
    assert [e.value for e in ea.Scalars("train/stage")] == [0.0, 0.0, 1.0, 1.0]
    for domain in ("if", "math"):
        for metric in ("greedy", "pass@2"):
            value = ea.Scalars(f"eval/{domain}/{metric}")
            low, high = ea.Scalars(f"eval/{domain}/{metric}/low"), ea.Scalars(f"eval/{domain}/{metric}/high")
            assert [e.step for e in value] == [e.step for e in low] == [e.step for e in high] == EVAL_STEPS
            assert all(lo.value <= v.value <= hi.value for v, lo, hi in zip(value, low, high, strict=True))
        assert [e.value for e in ea.Scalars(f"eval/{domain}/n")] == [4.0, 4.0, 4.0]
    table = ea.Tensors("report/regression_table/text_summary")
    assert [e.step for e in table] == [4]
    assert b"Regression table" in table[0].tensor_proto.string_val[0]
    config = json.loads(
        ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode().strip("`\njson")
    )
    assert config["name"] == "tracked" and config["run"] == {"distill": True, "mode": "embedded"}
    checkpoints = ea.Tensors("checkpoint/text_summary")
    assert {e.step for e in checkpoints} == {2, 3, 4}
    assert "report/curves" in tags["images"]
    assert ea.Images("report/curves")[0].step == 4


# ---------------------------------------------------------------------------------- MLflow


def _mlflow(tracked: TrackedRun) -> tuple[Any, str]:
    from mlflow.tracking import MlflowClient

    state = json.loads((tracked.run_dir / STATE_FILE).read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{(tracked.run_dir / 'mlflow' / 'mlflow.db').resolve()}"
    return MlflowClient(tracking_uri=state["tracking_uri"]), state["run_id"]


def test_mlflow_store_read_back(tracked: TrackedRun) -> None:
    client, run_id = _mlflow(tracked)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "tracked"
    params = run.data.params
    assert params["stages.0.grpo.group_size"] == "2"
    assert params["stages.1.domain"] == "math"
    assert params["run.distill"] == "True" and params["run.mode"] == "embedded"
    history = client.get_metric_history(run_id, "train/reward_mean")
    assert sorted(m.step for m in history) == STEPS
    for key in ("eval/math/pass_at_2", "eval/math/pass_at_2/low", "eval/math/pass_at_2/high"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == EVAL_STEPS
    assert "regression/if/final" in run.data.metrics
    assert run.data.metrics["regression/if/final_low"] <= run.data.metrics["regression/if/final"]
    assert run.data.tags["checkpoint/latest"].endswith("step-000004")
    top = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.json", "report", "checkpoints.json", "config"} <= top
    report = {a.path for a in client.list_artifacts(run_id, "report")}
    assert {"report/regression_table.md", "report/regression_table.json", "report/curves.png"} <= report
    checkpoints = json.loads(Path(client.download_artifacts(run_id, "checkpoints.json")).read_text())
    assert "step-000004" in checkpoints and any(k.startswith("teacher-if") for k in checkpoints)
    assert all(Path(p).is_dir() for p in checkpoints.values())


# ---------------------------------------------------------------------------------- W&B


def _wandb_records(path: Path) -> list[dict[str, Any]]:
    """The records of one offline transaction log, read by wandb's own `leet inspect`."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _wandb_logs(tracked: TrackedRun) -> tuple[str, list[list[dict[str, Any]]]]:
    run_id = json.loads((tracked.run_dir / STATE_FILE).read_text())["wandb"]["id"]
    files = sorted((tracked.run_dir / "wandb").glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"))
    return run_id, [_wandb_records(f) for f in files]


def _history(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return [
        (int(r["history"]["step"].get("num", 0)), r["history"]["item"])
        for r in records
        if r["type"] == "history"
    ]


def test_wandb_offline_run_read_back(tracked: TrackedRun) -> None:
    run_id, logs = _wandb_logs(tracked)
    assert len(logs) == 2  # one offline segment per process
    records = [r for log in logs for r in log]
    runs = [r["run"] for r in records if r["type"] == "run"]
    assert {r["run_id"] for r in runs} == {run_id} and {r["project"] for r in runs} == {"tracked"}
    config = runs[0]["config"]["update"]
    assert config["stages"][1]["domain"] == "math" and config["run"]["distill"] is True
    history = [(step, item) for log in logs for step, item in _history(log)]
    train = [step for step, item in history if "train/reward_mean" in item]
    assert train == STEPS
    evals = [step for step, item in history if "eval/if/pass@2" in item]
    assert evals == EVAL_STEPS
    for _, item in history:
        if "eval/if/pass@2" in item:
            assert item["eval/if/pass@2/low"] <= item["eval/if/pass@2"] <= item["eval/if/pass@2/high"]
    summary: dict[str, Any] = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    assert "regression/math/final" in summary and summary["checkpoint/latest"].endswith("step-000004")
    final = dict(history)[4]  # nested values come flattened: `<key>.<field>`
    assert final["report/curves._type"] == "image-file"
    assert final["report/regression_table._type"] == "table-file"
    table_file = final["report/regression_table.path"]
    table = json.loads(
        next((tracked.run_dir / "wandb").glob(f"offline-run-*/files/{table_file}")).read_text()
    )
    assert [row[0] for row in table["data"]] == ["if", "math"] and "final_low" in table["columns"]
    artifacts = [r["artifact"] for r in logs[1] if r["type"] == "artifact"]
    assert {"report", "model"} <= {a["type"] for a in artifacts}  # (W&B adds its own run_table)
    assert [r["exit"]["exit_code"] for r in logs[1] if r["type"] == "exit"] == [0]


# ---------------------------------------------------------------------------------- resume


def test_resumed_run_continues_the_same_tracked_runs(tracked: TrackedRun) -> None:
    state = json.loads((tracked.run_dir / STATE_FILE).read_text())
    assert state == tracked.state_after_stop  # same MLflow run id, W&B id, TensorBoard directory
    continued = [line for line in tracked.lines if "run continued" in line]
    assert len(continued) == 3, tracked.lines

    client, run_id = _mlflow(tracked)
    runs = client.search_runs([client.get_run(run_id).info.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    steps = [m.step for m in client.get_metric_history(run_id, "train/lr")]
    assert sorted(steps) == STEPS and len(set(steps)) == len(steps)

    _, logs = _wandb_logs(tracked)
    first, second = ([step for step, _ in _history(log)] for log in logs)
    assert first == [0, 1, 2, 3] and second == [4]  # contiguous, no step twice
    assert [r["run"]["resume"] for log in logs for r in log if r["type"] == "run"] == [True, True]


def test_tensorboard_hides_steps_redone_after_a_crash(tmp_path: Path) -> None:
    """A run that died after step 4 with its checkpoint at step 2 redoes steps 3 and 4: the
    reopened writer purges the first attempt's, so each step shows once, with the redone value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from cascade.config.tracking import TensorBoardSettings
    from cascade.tracking.base import RunContext
    from cascade.tracking.tensorboard_backend import TensorBoardBackend

    first = TensorBoardBackend(TensorBoardSettings())
    recorded = first.open(RunContext(run_dir=tmp_path, name="x", config={"a": 1}))
    for step in range(1, 5):
        first.log_metrics(step, {"train/loss": float(step)})
    first.close("interrupted")
    again = TensorBoardBackend(TensorBoardSettings())
    again.open(RunContext(tmp_path, "x", {"a": 1}, start_step=2, resumed=True, previous=recorded))
    for step in (3, 4):
        again.log_metrics(step, {"train/loss": 10.0 * step})
    again.close("completed")
    ea = EventAccumulator(recorded["log_dir"], size_guidance={"scalars": 0})
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


# ---------------------------------------------------------------------------------- missing extra


@pytest.mark.parametrize("backend", ["tensorboard", "mlflow", "wandb"])
def test_a_missing_extra_is_one_line_at_start(
    backend: str, tmp_path: Path, random_tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # `import <backend>` fails, find_spec finds nothing
    cfg = _config(tmp_path, random_tiny_model, [backend])
    with pytest.raises(TrackingUnavailable) as err:
        embedded_runner(cfg, run_dir=tmp_path / "run")
    message = str(err.value)
    assert "\n" not in message and backend in message and "pip install 'cascade-rl[tracking]'" in message
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_missing_extra_fails_the_cli_before_anything_runs(
    tmp_path: Path,
    random_tiny_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import yaml

    from cascade.cli.main import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = _config(tmp_path, random_tiny_model, [])
    path = tmp_path / "cascade.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run_dir = tmp_path / "run"
    assert (
        main(["run", str(path), "--track", "tensorboard,wandb", "--run-dir", str(run_dir), "--no-progress"])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: tracking.backends: wandb needs the 'wandb' package, which is not installed: "
        "pip install 'cascade-rl[tracking]'"
    ]
    assert not run_dir.exists()
    data = cfg.model_dump(mode="json")
    data["tracking"] = {"backends": ["wandb"]}
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path)]) == 2
    assert "pip install 'cascade-rl[tracking]'" in capsys.readouterr().err
    assert main(["validate", "--schema-only", str(path)]) == 0

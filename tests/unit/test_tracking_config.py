"""The `tracking:` section, `--track`, and the `Tracker` fan-out without any tracking library
(a fake backend): names, failure handling, `tracking.json`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cascade.config import ConfigError, parse_cascade_config, with_tracking
from cascade.config.diff import training_hash
from cascade.config.tracking import parse_track_flag
from cascade.eval.results import DomainEval, MetricValue
from cascade.tracking import STATE_FILE, Tracker
from cascade.tracking.base import RunContext, mask_password, numeric
from cascade.tracking.mlflow_backend import metric_key
from cascade.tracking.tracker import regression_summary


def _data(**tracking: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t",
        "model": {"path": "models/tiny"},
        "domains": [{"name": "math"}],
        "stages": [{"domain": "math"}],
    }
    if tracking:
        data["tracking"] = tracking
    return data


def test_tracking_section_defaults_and_validation() -> None:
    cfg = parse_cascade_config(_data())
    assert cfg.tracking.backends == [] and cfg.tracking.wandb.mode == "offline"
    assert cfg.tracking.mlflow.tracking_uri is None and cfg.tracking.tensorboard.log_dir is None
    cfg = parse_cascade_config(
        _data(backends=["mlflow", "wandb"], wandb={"mode": "online", "project": "p", "entity": "e"})
    )
    assert cfg.tracking.backends == ["mlflow", "wandb"] and cfg.tracking.wandb.entity == "e"
    with pytest.raises(ConfigError, match="tracking.backends.0"):
        parse_cascade_config(_data(backends=["neptune"]))
    with pytest.raises(ConfigError, match="listed twice"):
        parse_cascade_config(_data(backends=["mlflow", "mlflow"]))
    with pytest.raises(ConfigError, match="tracking.wandb.mode"):
        parse_cascade_config(_data(wandb={"mode": "shared"}))
    with pytest.raises(ConfigError, match="tracking.mlflow.uri"):
        parse_cascade_config(_data(mlflow={"uri": "x"}))


def test_track_flag_replaces_the_backends_and_leaves_the_training_hash() -> None:
    assert parse_track_flag("tensorboard, wandb,tensorboard") == ["tensorboard", "wandb"]
    assert parse_track_flag("none") == []
    with pytest.raises(ValueError, match="unknown tracking backend 'tb'"):
        parse_track_flag("tb")
    cfg = parse_cascade_config(_data(backends=["mlflow"], mlflow={"experiment": "x"}))
    assert with_tracking(cfg, None) is cfg
    tracked = with_tracking(cfg, ["tensorboard"])
    assert tracked.tracking.backends == ["tensorboard"] and tracked.tracking.mlflow.experiment == "x"
    assert training_hash(cfg.model_dump(mode="json")) == training_hash(tracked.model_dump(mode="json"))


def test_cli_refuses_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    from cascade.cli.main import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "x.yaml", "--track", "mlflow,comet"])
    assert exit_.value.code == 2
    assert "unknown tracking backend 'comet'" in capsys.readouterr().err
    args = build_parser().parse_args(["up", "x.yaml", "--track", "wandb"])
    assert args.track == ["wandb"]


def test_up_passes_track_to_the_learner(tmp_path: Path) -> None:
    from cascade.up.stack import LocalStack, Proc
    from services.learner.main import parse_args

    config = tmp_path / "c.yaml"
    config.write_text("name: x\n")
    args = parse_args([str(config), "--rollout", "127.0.0.1:1", "--track", "tensorboard,mlflow"])
    assert args.track == ["tensorboard", "mlflow"]
    assert parse_args([str(config), "--rollout", "127.0.0.1:1"]).track is None
    services = ("rollout", "teacher", "reward")  # the learner's argv names their addresses
    for track, expected in ((["wandb", "mlflow"], ["--track", "wandb,mlflow"]), ([], ["--track", "none"])):
        stack = LocalStack(
            config=config, model=tmp_path, run_dir=tmp_path / "run", log_dir=tmp_path, track=track
        )
        stack.procs = {name: Proc(name, [], tmp_path / name, port=1) for name in services}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(LocalStack, "_start", lambda self, proc: None)  # the argv only, no process
            argv = stack.start_learner().argv
        i = argv.index("--track")
        assert argv[i : i + 2] == expected
        assert argv[argv.index("--reward") + 1] == stack.procs["reward"].address  # code evals there
    stack = LocalStack(config=config, model=tmp_path, run_dir=tmp_path / "run", log_dir=tmp_path)
    stack.procs = {name: Proc(name, [], tmp_path / name, port=1) for name in services}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalStack, "_start", lambda self, proc: None)
        assert "--track" not in stack.start_learner().argv  # the config's tracking section decides


class FakeBackend:
    """Records every call; `fail` names methods that raise."""

    def __init__(self, name: str = "fake", fail: tuple[str, ...] = ()) -> None:
        self.name = name
        self.fail = fail
        self.calls: list[tuple[str, Any]] = []

    def _record(self, method: str, *args: Any) -> None:
        if method in self.fail:
            raise RuntimeError(f"{method} is down")
        self.calls.append((method, args))

    def open(self, ctx: RunContext) -> dict[str, Any]:
        self._record("open", ctx.start_step, ctx.resumed, dict(ctx.previous))
        return {"id": "run-1", "step": ctx.start_step}

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._record("log_metrics", step, dict(metrics))

    def log_text(self, step: int, tag: str, text: str) -> None:
        self._record("log_text", step, tag)

    def log_checkpoint(self, step: int, path: Path) -> None:
        self._record("log_checkpoint", step, path.name)

    def log_report(self, step: int, report_dir: Path, summary: Mapping[str, float]) -> None:
        self._record("log_report", step, dict(summary))

    def log_files(self, step: int, name: str, paths: Mapping[str, Path]) -> None:
        self._record("log_files", step, name, sorted(paths))

    def close(self, status: str) -> None:
        self._record("close", status)


def test_tracker_names_and_fan_out(tmp_path: Path) -> None:
    lines: list[str] = []
    backend = FakeBackend()
    tracker = Tracker([backend], run_dir=tmp_path, config={"a": 1}, log=lines.append)
    tracker.log_step(1, {"x": 1.0}, stage=0)  # before start: nothing (the runner starts it after loading)
    tracker.start(0)
    tracker.log_step(1, {"reward_mean": 0.5, "reasons": {"ok": 3}, "note": "text", "flag": True}, stage=0)
    metric = MetricValue(value=0.5, low=0.2, high=0.8, n=4, method="wilson")
    tracker.log_eval(1, {"math": DomainEval("math", 0.5, 4, {}, {"pass@2": metric}, "pass@2")})
    (tmp_path / "checkpoints" / "step-000001").mkdir(parents=True)
    tracker.log_checkpoint(1, tmp_path / "checkpoints" / "step-000001")
    tracker.finish("completed", None)
    assert backend.calls == [
        ("open", (0, False, {})),
        (
            "log_metrics",
            (1, {"train/reward_mean": 0.5, "train/reasons/ok": 3.0, "train/flag": 1.0, "train/stage": 0.0}),
        ),
        (
            "log_metrics",
            (
                1,
                {
                    "eval/math/n": 4.0,
                    "eval/math/pass@2": 0.5,
                    "eval/math/pass@2/low": 0.2,
                    "eval/math/pass@2/high": 0.8,
                },
            ),
        ),
        ("log_checkpoint", (1, "step-000001")),
        ("log_files", (1, "checkpoints", ["step-000001"])),
        ("close", ("completed",)),
    ]
    assert json.loads((tmp_path / STATE_FILE).read_text()) == {"fake": {"id": "run-1", "step": 0}}
    assert lines == ["tracking: fake run started (id run-1)"]
    tracker.log_step(2, {"x": 1.0}, stage=0)  # after finish: nothing
    assert len(backend.calls) == 6


def test_a_failing_backend_is_reported_and_the_others_go_on(tmp_path: Path) -> None:
    lines: list[str] = []
    broken, fine = FakeBackend("broken", fail=("log_metrics",)), FakeBackend("fine")
    tracker = Tracker([broken, fine], run_dir=tmp_path, log=lines.append)
    tracker.start(0)
    for step in range(1, 6):
        tracker.log_step(step, {"x": float(step)}, stage=0)
    tracker.close("interrupted")
    assert [c[0] for c in fine.calls].count("log_metrics") == 5
    failures = [line for line in lines if "broken log_metrics failed" in line]
    assert len(failures) == 3 and failures[-1].endswith("(further failures counted only)")
    assert fine.calls[-1] == ("close", ("interrupted",)) and broken.calls[-1] == ("close", ("interrupted",))


def test_a_backend_that_cannot_open_fails_the_start(tmp_path: Path) -> None:
    from cascade.tracking import TrackingUnavailable

    opened = FakeBackend("first")
    tracker = Tracker([opened, FakeBackend("down", fail=("open",))], run_dir=tmp_path, log=lambda _: None)
    with pytest.raises(TrackingUnavailable, match="tracking: down could not start: open is down"):
        tracker.start(0)
    assert opened.calls[-1] == ("close", ("failed",))  # what did open is closed again


def test_close_without_a_status_reads_the_exception_in_flight(tmp_path: Path) -> None:
    backend = FakeBackend()
    tracker = Tracker([backend], run_dir=tmp_path, log=lambda _: None)
    tracker.start(0)
    try:
        raise ValueError("boom")
    except ValueError:
        tracker.close()
    assert backend.calls[-1] == ("close", ("failed",))


def test_helpers() -> None:
    assert numeric({"a": 1, "b": {"c": 2.5, "d": None}, "e": [1], "s": "x"}, "train") == {
        "train/a": 1.0,
        "train/b/c": 2.5,
        "train/e/0": 1.0,
    }
    assert metric_key("eval/math/pass@4/low") == "eval/math/pass_at_4/low"
    assert metric_key("train/a,b") == "train/a_b"
    assert mask_password("postgresql://me:secret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert mask_password("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_regression_summary(tmp_path: Path) -> None:
    row = {
        "domain": "math",
        "start": 0.1,
        "after": {"math": 0.4},
        "best": 0.5,
        "best_global_step": 10,
        "final": 0.4,
        "final_minus_best": -0.1,
        "start_ci": [0.0, 0.3],
        "best_ci": [0.3, 0.7],
        "final_ci": None,
        "drop_outside_noise": False,
    }
    (tmp_path / "regression_table.json").write_text(json.dumps({"stages": ["math"], "rows": [row]}))
    summary = regression_summary(tmp_path)
    assert summary["regression/math/final"] == 0.4 and summary["regression/math/best_low"] == 0.3
    assert (
        summary["regression/math/after/math"] == 0.4 and summary["regression/math/drop_outside_noise"] == 0.0
    )
    assert "regression/math/final_low" not in summary  # no interval: nothing logged
    assert regression_summary(tmp_path / "missing") == {}

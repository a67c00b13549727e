"""Whole cascades in one process on the random tiny model: if -> math with distillation.

What is checked is the plumbing a real run relies on: the report files, every row in the
store (stages, steps, evals, teachers, events), the ablation without distillation, exact
resume after an interruption, refusing to overwrite a run, Postgres as the store, and the
other loss variants (full / top-k distillation, stale rollouts, KL to the reference).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from cascade.cli.main import main as cli_main
from cascade.runner.checkpoint import latest_checkpoint
from cascade.runner.embedded import RunDirError, embedded_runner

STAGE_STEPS = 4
EVAL_GLOBAL_STEPS = [0, 2, 4, 6, 8]
"""Evals of both domains: the cascade's start, then every 2 stage steps (stage ends coincide)."""


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _expected_teachers(rows: Any, first_global_step: dict[str, int]) -> list[tuple[str, int]]:
    """Each domain's teacher: its best eval (earliest on ties) once it is being trained.

    `first_global_step[d]` is the first global step at which domain d counts as trained
    (evals at global step 0, the cascade's start, never make a teacher).
    """
    out = []
    for domain, start in sorted(first_global_step.items()):
        candidates = [
            (g, score) for _, _, g, d, score, *_ in rows.evals if d == domain and g >= max(start, 1)
        ]
        best = max(score for _, score in candidates)
        out.append((domain, min(g for g, score in candidates if score == best)))
    return out


# --------------------------------------------------------------------------- the main run


@pytest.fixture(scope="module")
def main_run(e2e, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("main")
    cfg = e2e.config(directory)
    logged = e2e.run(cfg)
    run_dir = cfg.output_dir / cfg.name
    return {
        "cfg": cfg,
        "result": logged.result,
        "log": logged.lines,
        "run_dir": run_dir,
        "rows": e2e.rows(e2e.sqlite_url(run_dir)),
    }


def test_run_result(main_run: dict[str, Any]) -> None:
    result = main_run["result"]
    assert result.finished
    assert result.stopped_by == "completed"
    assert result.run_dir == main_run["run_dir"]
    assert result.report_dir == main_run["run_dir"] / "report"
    assert any("stage 2/2 'math' (math), teachers: ['if']" in line for line in main_run["log"])
    run_json = json.loads((main_run["run_dir"] / "run.json").read_text())
    assert run_json["distill"] is True
    assert run_json["config"]["name"] == "e2e"


def test_report_files(main_run: dict[str, Any]) -> None:
    report = main_run["result"].report_dir
    md = (report / "regression_table.md").read_text()
    assert "| if |" in md and "| math |" in md
    table = json.loads((report / "regression_table.json").read_text())
    assert [r["domain"] for r in table["rows"]] == ["if", "math"]
    assert list(table["stages"]) == ["if", "math"]
    for name in ("curves.png", "curves_if.png", "curves_math.png"):
        width, height = _png_size(report / name)
        assert width > 100 and height > 100
    metrics = json.loads((report / "metrics.json").read_text())
    assert "regression_table" in metrics
    json.dumps(metrics, allow_nan=False)  # strict JSON: no NaN / Infinity literals
    # The table is the store's evals: start = global step 0, final = the last eval.
    scores = {(d, g): score for _, _, g, d, score, *_ in main_run["rows"].evals}
    for row in table["rows"]:
        assert row["start"] == pytest.approx(scores[(row["domain"], 0)])
        assert row["final"] == pytest.approx(scores[(row["domain"], EVAL_GLOBAL_STEPS[-1])])
        assert row["after"]["if"] == pytest.approx(scores[(row["domain"], STAGE_STEPS)])


def test_stages_completed(main_run: dict[str, Any]) -> None:
    rows = main_run["rows"]
    assert rows.run_status == "completed"
    assert rows.distill is True
    assert rows.stages == [(0, "if", "if", "completed"), (1, "math", "math", "completed")]


def test_step_rows(main_run: dict[str, Any]) -> None:
    rows = main_run["rows"]
    expected = [(0, s, s) for s in range(1, STAGE_STEPS + 1)]
    expected += [(1, s, STAGE_STEPS + s) for s in range(1, STAGE_STEPS + 1)]
    assert [(stage, step, g) for stage, step, g, _ in rows.steps] == expected
    for _, _, _, metrics in rows.steps:
        assert 0.0 <= metrics["reward_mean"] <= 1.0
        assert metrics["token_budget"] == 16.0
        assert metrics["staleness"] == 0.0
        assert sum(metrics["reasons"].values()) == 16  # prompts_per_step x group_size
        assert _finite(metrics["grad_norm_rl"])
    for metrics in rows.step_metrics(0):
        assert "loss_distill" not in metrics  # no teacher yet in the first stage
        assert metrics["lambda"] == 0.0
    for metrics in rows.step_metrics(1):
        assert _finite(metrics["loss_distill"])  # a surrogate (sampled tokens): any sign
        assert _finite(metrics["distill_if_reverse_kl"])
        assert _finite(metrics["grad_norm_distill"])
        if metrics["distill_if_reverse_kl"] != 0.0:  # the student has moved away from the teacher
            assert metrics["grad_norm_distill"] > 0.0
        assert metrics["lambda"] == 1.0
        assert metrics["distill_if_n_tokens"] > 0
        assert metrics["skipped_update"] == 0.0
        # The ratio is defined exactly when the RL term had a gradient.
        if metrics["grad_norm_rl"] > 0:
            assert _finite(metrics["grad_norm_ratio_distill_rl"])
            ratio = metrics["grad_norm_distill"] / metrics["grad_norm_rl"]
            assert metrics["grad_norm_ratio_distill_rl"] == pytest.approx(ratio, rel=1e-6)
        else:
            assert "grad_norm_ratio_distill_rl" not in metrics


def test_eval_rows(main_run: dict[str, Any]) -> None:
    rows = main_run["rows"]
    got = sorted((g, domain) for _, _, g, domain, *_ in rows.evals)
    assert got == sorted((g, d) for g in EVAL_GLOBAL_STEPS for d in ("if", "math"))
    for stage, step, g, _, score, n, reasons in rows.evals:
        assert stage == (0 if g <= STAGE_STEPS else 1)
        assert step == (g if stage == 0 else g - STAGE_STEPS)
        assert 0.0 <= score <= 1.0
        assert n == 16 and sum(reasons.values()) == 16


def test_teachers(main_run: dict[str, Any]) -> None:
    rows = main_run["rows"]
    # Exactly one teacher per domain, the best eval (`if` from its first stage on, math from 2).
    assert [(d, g) for d, g, _ in rows.teachers] == _expected_teachers(rows, {"if": 1, "math": 5})
    for _, _, path in rows.teachers:
        assert (Path(path) / "config.json").exists()
        assert (Path(path) / "model.safetensors").exists()
    # `if` is only offered while or after it is trained (never at the cascade's start),
    # math only from stage 2 on.
    assert all(g > 0 for _, g in rows.teacher_candidates)
    assert all(g > STAGE_STEPS for d, g in rows.teacher_candidates if d == "math")
    on_disk = sorted(p.name for p in (main_run["run_dir"] / "teachers").iterdir())
    assert on_disk == sorted(Path(p).name for _, _, p in rows.teachers)


def test_checkpoints(main_run: dict[str, Any]) -> None:
    rows = main_run["rows"]
    assert {2, 4, 6, 8} <= set(rows.resume_checkpoints)
    kept = sorted(p.name for p in (main_run["run_dir"] / "checkpoints").iterdir())
    assert kept == ["step-000006", "step-000008"]  # keep_last: 2
    assert latest_checkpoint(main_run["run_dir"] / "checkpoints") == (
        main_run["run_dir"] / "checkpoints" / "step-000008"
    )


def test_events(main_run: dict[str, Any]) -> None:
    events = main_run["rows"].events
    assert events
    assert {actor for *_, actor in events} == {"runner"}
    transitions = [(f, t) for kind, f, t, _ in events if kind == "transition"]
    assert transitions.count(("pending", "running")) == 2
    assert transitions.count(("running", "completed")) == 2
    teacher_events = sum(1 for kind, *_ in events if kind == "teacher")
    assert teacher_events == len(main_run["rows"].teacher_candidates) >= 2


def test_existing_run_dir_is_refused(main_run: dict[str, Any]) -> None:
    run_dir = main_run["run_dir"]
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(RunDirError, match="--resume"):
        embedded_runner(main_run["cfg"], run_dir=run_dir, log=lambda _: None)
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_fresh_moves_the_old_run_aside(e2e, tmp_path: Path) -> None:
    cfg = e2e.config(tmp_path)
    run_dir = tmp_path / "runs" / "e2e"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "stale.txt").write_text("old")
    embedded_runner(cfg, run_dir=run_dir, fresh=True, log=lambda _: None)
    assert not (run_dir / "stale.txt").exists()
    [old] = run_dir.parent.glob("e2e.old-*")
    assert (old / "stale.txt").read_text() == "old"  # nothing deleted


# --------------------------------------------------------------------------- ablation


def test_no_distill_run_through_cli(e2e, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = e2e.config(tmp_path)
    config_path = tmp_path / "cascade.yaml"
    code = cli_main(["run", str(config_path), "--no-distill", "--no-progress"])
    assert code == 0
    run_dir = cfg.output_dir / "e2e-no-distill"
    assert f"report: {run_dir / 'report'}" in capsys.readouterr().out
    rows = e2e.rows(e2e.sqlite_url(run_dir))
    assert rows.distill is False
    assert [s[3] for s in rows.stages] == ["completed", "completed"]
    assert len(rows.steps) == 2 * STAGE_STEPS
    for _, _, _, metrics in rows.steps:
        assert "loss_distill" not in metrics
        assert not any(k.startswith("distill_") for k in metrics)
        assert metrics["lambda"] == 0.0
    assert (run_dir / "report" / "regression_table.json").exists()


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    "stop_after",
    [
        4,  # the last step of stage 1: resumes straight into the stage switch
        5,  # the first step of stage 2 (the `if` teacher is loaded again after resuming)
        7,  # between periodic checkpoints, after the math teacher was taken at step 6
    ],
)
def test_resume_matches_uninterrupted_run(
    e2e, tmp_path: Path, main_run: dict[str, Any], stop_after: int
) -> None:
    cfg = e2e.config(tmp_path)
    run_dir = cfg.output_dir / cfg.name
    first = e2e.run(cfg, stop_after_steps=stop_after)
    assert first.result.stopped_by == "interrupted"
    assert not first.result.finished
    assert not (run_dir / "report").exists()
    ckpt = f"step-{stop_after:06d}"
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / ckpt
    partial = e2e.rows(e2e.sqlite_url(run_dir))
    assert partial.run_status == "running"
    assert len(partial.steps) == stop_after
    in_stage_two = stop_after > STAGE_STEPS
    expected_states = ["completed", "running"] if in_stage_two else ["running", "pending"]
    assert [s[3] for s in partial.stages] == expected_states

    second = e2e.run(cfg, resume=True)
    assert second.result.stopped_by == "completed" and second.result.finished
    assert any(f"resumed from {ckpt}" in line for line in second.lines)

    resumed, straight = e2e.rows(e2e.sqlite_url(run_dir)), main_run["rows"]
    assert resumed.run_status == "completed"
    assert resumed.stages == straight.stages
    assert [m["reward_mean"] for *_, m in resumed.steps] == [m["reward_mean"] for *_, m in straight.steps]
    # Every other step metric too (but wall-clock times): same tokens, same updates. With a
    # random model the rewards are mostly 0, so this is the comparison with teeth.
    assert resumed.without_timing() == straight.without_timing()
    assert resumed.evals == straight.evals
    assert [(d, g) for d, g, _ in resumed.teachers] == [(d, g) for d, g, _ in straight.teachers]

    a = load_file(str(run_dir / "checkpoints" / "step-000008" / "model.safetensors"))
    b = load_file(str(main_run["run_dir"] / "checkpoints" / "step-000008" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key

    if stop_after == 5:
        # Resuming a finished run only writes the report again.
        third = e2e.run(cfg, resume=True)
        assert third.result.stopped_by == "already finished"
        assert len(e2e.rows(e2e.sqlite_url(run_dir)).steps) == 2 * STAGE_STEPS
        assert (run_dir / "report" / "regression_table.json").exists()


# --------------------------------------------------------------------------- Postgres


@pytest.mark.postgres
def test_postgres_store(e2e, tmp_path: Path, postgres_url: str) -> None:
    def shorter(data: dict[str, Any]) -> None:
        for stage in data["stages"]:
            stage["advance"]["max_steps"] = 2

    cfg = e2e.config(tmp_path, shorter)
    logged = e2e.run(cfg, db_url=postgres_url)
    assert logged.result.finished
    run_dir = cfg.output_dir / cfg.name
    assert not (run_dir / "cascade.db").exists()
    rows = e2e.rows(postgres_url)
    assert rows.run_status == "completed"
    assert [s[3] for s in rows.stages] == ["completed", "completed"]
    assert [(s, st, g) for s, st, g, _ in rows.steps] == [(0, 1, 1), (0, 2, 2), (1, 1, 3), (1, 2, 4)]
    assert all("loss_distill" in m for m in rows.step_metrics(1))
    assert sorted((g, d) for _, _, g, d, *_ in rows.evals) == [
        (g, d) for g in (0, 2, 4) for d in ("if", "math")
    ]
    assert [(d, g) for d, g, _ in rows.teachers] == _expected_teachers(rows, {"if": 1, "math": 3})
    assert {actor for *_, actor in rows.events} == {"runner"}
    assert (run_dir / "report" / "regression_table.json").exists()


# --------------------------------------------------------------------------- loss variants


def _short_stage_two(**stage_two: Any):
    """Stage 1: one `if` step (and its eval, which makes the teacher); stage 2: two math steps."""

    def edit(data: dict[str, Any]) -> None:
        first, second = data["stages"]
        first["advance"]["max_steps"] = 1
        first["eval"]["every"] = 1
        second["advance"]["max_steps"] = 2
        for key, value in stage_two.items():
            second.setdefault(key, {}).update(value)

    return edit


@pytest.mark.parametrize("loss", ["full", "topk"])
def test_dense_distillation_losses(e2e, tmp_path: Path, loss: str) -> None:
    cfg = e2e.config(tmp_path, _short_stage_two(distill={"loss": loss, "topk": 8}))
    assert e2e.run(cfg).result.finished
    rows = e2e.rows(e2e.sqlite_url(cfg.output_dir / cfg.name))
    stage_two = rows.step_metrics(1)
    assert len(stage_two) == 2
    for metrics in stage_two:
        # Both are KL divergences (top-k: plus the student's missing top-k mass): never negative.
        assert _finite(metrics["loss_distill"]) and metrics["loss_distill"] >= -1e-6
        assert metrics["distill_if_kl"] == pytest.approx(metrics["loss_distill"])  # temperature 1
        assert _finite(metrics["distill_if_reverse_kl"])
        assert _finite(metrics["grad_norm_distill"])
        assert metrics["distill_if_n_tokens"] > 0
    if loss == "topk":
        # The student is near uniform over 384 ids: most of its mass is outside the top 8.
        assert all(m["loss_distill"] > 1.0 for m in stage_two)


@pytest.fixture(scope="module")
def stale_kl_run(e2e, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Stage 2 with 1-step-stale rollouts and a KL penalty; every sequence kept in the loss
    (no zero-variance drop, overlong completions scored 0) so the RL term always exists.

    The random model earns no reward, so nothing would ever move the policy away from the
    stage-start reference (the KL and its gradient would stay 0). AdamW's decoupled weight
    decay moves it regardless of the gradient: after the first step, KL > 0."""
    directory = tmp_path_factory.mktemp("stale-kl")
    edit = _short_stage_two(
        grpo={
            "max_staleness": 1,
            "kl_coef": 0.05,
            "overlong": "zero",
            "learning_rate": 0.01,
            "weight_decay": 1.0,
        },
        filter={"drop_zero_variance": False},
    )

    def three_steps(data: dict[str, Any]) -> None:
        edit(data)
        data["stages"][1]["advance"]["max_steps"] = 3

    cfg = e2e.config(directory, three_steps)
    assert e2e.run(cfg).result.finished
    return e2e.rows(e2e.sqlite_url(cfg.output_dir / cfg.name)).step_metrics(1)


def test_kl_penalty_logged(stale_kl_run: list[dict[str, Any]]) -> None:
    assert len(stale_kl_run) == 3
    for metrics in stale_kl_run:
        assert _finite(metrics["grpo_kl"]) and metrics["grpo_kl"] >= 0.0
        assert _finite(metrics["loss_rl"])
        assert metrics["kept_sequences"] == 16.0
    # At the stage's first step the policy is the reference: KL 0. Later it has moved.
    assert stale_kl_run[0]["grpo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stale_kl_run[-1]["grpo_kl"] > 0.0
    # Weight decay moved the student away from the (initial-model) teacher too.
    assert stale_kl_run[-1]["grad_norm_distill"] > 0.0
    with_rl_grad = [m for m in stale_kl_run if m["grad_norm_rl"] > 0]
    assert with_rl_grad, "the KL term should give the RL term a gradient once the policy moved"
    for metrics in with_rl_grad:
        assert _finite(metrics["grad_norm_ratio_distill_rl"]) and metrics["grad_norm_ratio_distill_rl"] > 0


def test_stale_rollouts_logged(stale_kl_run: list[dict[str, Any]]) -> None:
    """max_staleness 1: after the first step, rollouts come from the previous policy version,
    and the clipped importance ratio is logged."""
    staleness = [m["staleness"] for m in stale_kl_run]
    assert all(s in (0.0, 1.0) for s in staleness), staleness
    assert 1.0 in staleness, f"max_staleness: 1 never produced a stale rollout: {staleness}"
    for metrics in stale_kl_run:
        assert _finite(metrics["grpo_clip_fraction"]) and 0.0 <= metrics["grpo_clip_fraction"] <= 1.0
        assert _finite(metrics["grpo_ratio_mean"])
    # The policy moves every step (weight decay), so a stale rollout's importance ratio is not 1.
    stale = [m for m in stale_kl_run if m["staleness"] == 1.0]
    assert any(abs(m["grpo_ratio_mean"] - 1.0) > 1e-6 for m in stale)

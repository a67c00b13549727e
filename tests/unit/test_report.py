"""The end-of-run report from a hand-built history: table values, rendered numbers, real PNGs."""

from __future__ import annotations

import json
import re
import struct
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from cascade.eval.stats import wilson_interval
from cascade.runner.report import (
    format_drop,
    format_score,
    load_regression_table,
    render_markdown,
    render_regression_table,
    table_cells,
    training_metrics,
    write_report,
)
from cascade.store.history import (
    EvalPoint,
    RegressionRow,
    RegressionTable,
    RunHistory,
    StageSpan,
    StepPoint,
    build_regression_table,
    final_evals_by_stage,
)

# (stage index, stage step, global step, math, sort); stage 1 starts at global step 30.
EVALS = [
    (0, 0, 0, 0.41, 0.56),
    (0, 15, 15, 0.80, 0.55),
    (0, 30, 30, 0.976, 0.50),
    (1, 10, 40, 0.90, 0.80),
    (1, 20, 50, 0.718, 0.97),
]


def _history() -> RunHistory:
    evals = [
        EvalPoint(stage, step, g, domain, score, 128, {"ok": round(128 * score)})
        for stage, step, g, math_score, sort_score in EVALS
        for domain, score in (("math", math_score), ("sort", sort_score))
    ]
    steps = [StepPoint(0, s, s, {"loss": 1.0 / s, "kl": float("nan")}) for s in range(1, 31)]
    steps += [StepPoint(1, s, 30 + s, {"loss": 0.5}) for s in range(1, 21)]
    stages = [StageSpan(0, "math-rl", "math", "completed"), StageSpan(1, "sort-rl", "sort", "completed")]
    # `code` is configured but never evaluated: its row must show "missing", not crash.
    return RunHistory(
        stages=stages,
        evals=evals,
        steps=steps,
        domains=["math", "code"],
        run_id=7,
        cascade_name="demo",
        run_info={"seed": 0},
    )


def test_regression_table_values() -> None:
    history = _history()
    assert history.domains == ["math", "code", "sort"]
    assert [(s.start_global_step, s.end_global_step) for s in history.stages] == [(0, 30), (30, 50)]
    table = build_regression_table(history)
    assert table.columns == ["domain", "start", "after math-rl", "after sort-rl", "best", "final - best"]
    math = table.row("math")
    assert (math.start, math.after, math.best, math.best_global_step, math.final) == (
        0.41, [0.976, 0.718], 0.976, 30, 0.718,
    )  # fmt: skip
    assert math.final_minus_best == pytest.approx(-0.258)
    sort = table.row("sort")
    assert (sort.start, sort.after, sort.best, sort.final_minus_best) == (0.56, [0.50, 0.97], 0.97, 0.0)
    code = table.row("code")
    assert (code.start, code.after, code.best, code.final_minus_best) == (None, [None, None], None, None)
    finals = final_evals_by_stage(history.evals)
    assert {i: {d: e.step for d, e in by.items()} for i, by in finals.items()} == {
        0: {"math": 30, "sort": 30},
        1: {"math": 20, "sort": 20},
    }


def test_formatting() -> None:
    assert [format_score(x) for x in (0.976, 0.0, 1.0, None)] == ["97.6%", "0.0%", "100.0%", "—"]
    assert [format_drop(x) for x in (-0.258, 0.0, -0.0001, 0.031, None)] == [
        "-25.8 pp", "0.0 pp", "0.0 pp", "+3.1 pp", "—",
    ]  # fmt: skip


def test_markdown_and_rich_tables_show_the_numbers() -> None:
    table = build_regression_table(_history())
    lines = render_markdown(table).splitlines()
    assert lines[0] == "| domain | start | after math-rl | after sort-rl | best | final - best |"
    assert lines[2:] == [
        "| math | 41.0% | 97.6% | 71.8% | 97.6% | -25.8 pp |",
        "| code | — | — | — | — | — |",
        "| sort | 56.0% | 50.0% | 97.0% | 97.0% | 0.0 pp |",
    ]
    console = Console(record=True, width=140)
    console.print(render_regression_table(table))
    text = console.export_text()
    assert "after sort-rl" in text and "-25.8 pp" in text and "71.8%" in text


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_write_report_files(tmp_path: Path) -> None:
    files = write_report(_history(), 7, tmp_path / "out")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [
        "curves.png", "curves_code.png", "curves_math.png", "curves_sort.png",
        "metrics.json", "regression_table.json", "regression_table.md",
    ]  # fmt: skip
    for png in [files.curves, *files.domain_curves.values()]:
        width, height = _png_size(png)
        assert width > 300 and height > 200

    import matplotlib.image

    assert matplotlib.image.imread(files.curves).shape[2] in (3, 4)

    md = files.regression_md.read_text()
    assert md.startswith("# Regression table: demo, run 7")
    assert "| math | 41.0% | 97.6% | 71.8% | 97.6% | -25.8 pp |" in md

    table = json.loads(files.regression_json.read_text())
    math = next(r for r in table["rows"] if r["domain"] == "math")
    assert math["after"] == {"math-rl": 0.976, "sort-rl": 0.718}
    assert math["final_minus_best"] == pytest.approx(-0.258)

    metrics = json.loads(files.metrics_json.read_text())
    assert len(metrics["steps"]) == 50 and len(metrics["evals"]) == 10
    assert metrics["steps"][0]["metrics"] == {"loss": 1.0, "kl": None}
    assert metrics["stages"][1]["start_global_step"] == 30


def test_write_report_refuses_a_mismatched_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run 7"):
        write_report(_history(), 8, tmp_path)


def _history_with_intervals() -> RunHistory:
    """math on 100 prompts: best 60/100 then final 55/100 (within noise); sort on 4000 prompts:
    best 60% then final 55% (outside noise). Each eval also has a sampled pass@2."""

    def point(stage: int, step: int, g: int, domain: str, ok: int, n: int) -> EvalPoint:
        low, high = wilson_interval(ok, n)
        p2 = min(1.0, ok / n + 0.2)
        metrics = {
            "greedy": {"value": ok / n, "low": low, "high": high, "n": n, "method": "wilson"},
            "pass@2": {
                "value": p2,
                "low": p2 - 0.05,
                "high": min(1.0, p2 + 0.05),
                "n": n,
                "method": "bootstrap",
            },
        }
        return EvalPoint(stage, step, g, domain, ok / n, n, {"ok": ok}, metrics)

    evals = [
        point(0, 0, 0, "math", 40, 100),
        point(0, 10, 10, "math", 60, 100),
        point(1, 10, 20, "math", 55, 100),
        point(0, 0, 0, "sort", 1600, 4000),
        point(0, 10, 10, "sort", 2400, 4000),
        point(1, 10, 20, "sort", 2200, 4000),
    ]
    stages = [StageSpan(0, "math-rl", "math", "completed"), StageSpan(1, "sort-rl", "sort", "completed")]
    return RunHistory(stages=stages, evals=evals, run_id=3, cascade_name="ci")


def test_regression_table_intervals_and_noise_flag() -> None:
    table = build_regression_table(_history_with_intervals())
    math, sort = table.row("math"), table.row("sort")
    assert math.start_ci == wilson_interval(40, 100)
    assert math.after_ci == [wilson_interval(60, 100), wilson_interval(55, 100)]
    assert (math.best_ci, math.final_ci) == (wilson_interval(60, 100), wilson_interval(55, 100))
    assert math.final_minus_best == pytest.approx(-0.05) and math.drop_outside_noise is False
    assert sort.final_minus_best == pytest.approx(-0.05) and sort.drop_outside_noise is True
    cells = dict(zip([r.domain for r in table.rows], table_cells(table), strict=True))
    assert cells["math"][1] == "40.0% [30.9-49.8]"
    assert cells["math"][-1] == "-5.0 pp, within noise"
    assert cells["sort"][-1] == "-5.0 pp, outside noise"
    md = render_markdown(table)
    assert "| math | 40.0% [30.9-49.8] |" in md and "outside noise" in md
    # the table of another recorded metric
    p2 = build_regression_table(_history_with_intervals(), metric="pass@2")
    assert p2.metric == "pass@2"
    assert p2.row("math").best == pytest.approx(0.8) and p2.row("math").best_ci == pytest.approx((0.75, 0.85))
    assert p2.row("math").drop_outside_noise is False  # 0.75 vs 0.80 +- 0.05 overlap


def test_report_json_round_trips_intervals(tmp_path: Path) -> None:
    files = write_report(_history_with_intervals(), 3, tmp_path)
    data = json.loads(files.regression_json.read_text())
    assert "interval" in data["noise_rule"]
    sort = next(r for r in data["rows"] if r["domain"] == "sort")
    assert sort["drop_outside_noise"] is True
    assert sort["final_ci"] == pytest.approx(list(wilson_interval(2200, 4000)))
    assert set(sort["after_ci"]) == {"math-rl", "sort-rl"}
    metrics = json.loads(files.metrics_json.read_text())
    assert metrics["evals"][0]["metrics"]["greedy"]["method"] == "wilson"
    again = load_regression_table(tmp_path)
    assert again == build_regression_table(_history_with_intervals())
    assert "within noise" in files.regression_md.read_text()


def test_old_evals_without_intervals_still_tabulate() -> None:
    table = build_regression_table(_history())
    math = table.row("math")
    assert (math.start_ci, math.best_ci, math.drop_outside_noise) == (None, None, None)
    assert table_cells(table)[0][-1] == "-25.8 pp"
    assert format_drop(-0.1, True) == "-10.0 pp, outside noise" and format_drop(0.0, True) == "0.0 pp"
    assert format_score(0.5, (0.4, 0.6)) == "50.0% [40.0-60.0]"


# --------------------------------------------------------------------------- the table at 80 columns

WIDE_DOMAINS = ["math", "code-gen", "instr-foll", "sorting", "[agent]"]


def _five_by_five() -> RegressionTable:
    """5 domains x 5 stages, every score with an interval like [38.7-52.1]; the last domain's
    name and a stage label look like rich markup."""
    stages = ["math-rl", "code-rl", "if-rl", "sort-rl", "[agent]"]
    rows = []
    for k, domain in enumerate(WIDE_DOMAINS):
        after = [0.45 + 0.01 * (i + k) for i in range(5)]
        rows.append(
            RegressionRow(
                domain=domain,
                start=0.453,
                after=after,
                best=0.6,
                best_global_step=30,
                final=after[-1],
                start_ci=(0.387, 0.521),
                after_ci=[(0.387 + 0.01 * i, 0.521 + 0.01 * k) for i in range(5)],
                best_ci=(0.55, 0.65),
                final_ci=(0.387 + 0.04, 0.521 + 0.01 * k),
            )
        )
    return RegressionTable(stage_labels=stages, rows=rows)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_regression_table_fits_the_terminal(width: int) -> None:
    table = _five_by_five()
    out = StringIO()
    Console(width=width, file=out).print(render_regression_table(table))
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    cells = table_cells(table)
    for domain, row in zip(WIDE_DOMAINS, cells, strict=True):
        assert re.search(rf"│ {re.escape(domain)} +│", text), (domain, text)  # whole, in its own cell
        for cell in row[1:-1]:
            score, interval = cell.split(" [")
            assert score in text and f"[{interval}" in text, (cell, text)
    for label in table.stage_labels:  # a header may wrap at its space, never lose a character
        assert label in text, label
    assert "[low-high]" in text  # the legend's brackets are not taken for markup
    assert "outside noise" in text


def test_a_wide_console_keeps_one_table() -> None:
    out = StringIO()
    Console(width=200, file=out).print(render_regression_table(_five_by_five()))
    text = out.getvalue()
    assert text.count("Regression table") == 1 and "(1/2)" not in text
    assert "after sort-rl" in text and "after [agent]" in text
    narrow = StringIO()
    Console(width=80, file=narrow).print(render_regression_table(_five_by_five()))
    assert "Regression table (1/2)" in narrow.getvalue() and "Regression table (2/2)" in narrow.getvalue()
    assert narrow.getvalue().count("start: eval before the first stage") == 1  # the legend once, at the end


# --------------------------------------------------------------------------- training curves


def _trained_history() -> RunHistory:
    """Two stages: the first records reward, KL, clip fraction, length and entropy; the second
    (distillation) adds lambda and the distillation loss. No stage records `kl` as NaN only."""
    first = {
        "reward_mean": 0.1,
        "kl": 0.001,
        "clip_fraction": 0.02,
        "completion_tokens_mean": 100,
        "entropy": 1.5,
    }
    steps = [
        StepPoint(
            0, s, s, {**{k: v * s for k, v in first.items()}, "reasons": {"ok": 3}, "skipped_update": True}
        )
        for s in range(1, 11)
    ]
    second = {"reward_mean": 0.5, "lambda": 0.5, "kl": float("nan")}
    steps += [StepPoint(1, s, 10 + s, {**second, "loss_distill": 0.3 / s}) for s in range(1, 6)]
    stages = [StageSpan(0, "math-rl", "math", "completed"), StageSpan(1, "sort/rl", "sort", "completed")]
    evals = [EvalPoint(0, 0, 0, "math", 0.4, 16), EvalPoint(1, 5, 15, "math", 0.5, 16)]
    return RunHistory(stages=stages, evals=evals, steps=steps, run_id=9, cascade_name="trained")


def test_training_curves_are_in_the_report(tmp_path: Path) -> None:
    history = _trained_history()
    assert training_metrics(history.steps) == [
        "reward_mean", "kl", "loss_distill", "lambda", "completion_tokens_mean", "clip_fraction", "entropy",
    ]  # fmt: skip
    assert training_metrics([s for s in history.steps if s.stage_index == 1]) == [
        "reward_mean",
        "loss_distill",
        "lambda",
    ]  # fmt: skip  (its KL is NaN only: no panel)
    files = write_report(history, 9, tmp_path)
    assert files.training_curves == tmp_path / "training.png"
    assert files.stage_training_curves == {
        "math-rl": tmp_path / "training_math-rl.png",
        "sort/rl": tmp_path / "training_sort_rl.png",
    }
    for png in [files.training_curves, *files.stage_training_curves.values()]:
        width, height = _png_size(png)
        assert width > 300 and height > 200
    # seven panels in two columns are taller than the second stage's three
    assert _png_size(files.training_curves)[1] > _png_size(files.stage_training_curves["sort/rl"])[1]


def test_no_training_metric_draws_no_training_curve(tmp_path: Path) -> None:
    files = write_report(_history(), 7, tmp_path)  # its steps record `loss` and a NaN `kl` only
    assert files.training_curves is None and files.stage_training_curves == {}
    assert not list(tmp_path.glob("training*.png"))

"""The end-of-run report from a hand-built history: table values, rendered numbers, real PNGs."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from rich.console import Console

from cascade.report import format_drop, format_score, render_markdown, render_regression_table, write_report
from cascade.store.history import (
    EvalPoint,
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

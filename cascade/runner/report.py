"""The end-of-run report: did each stage help its domain, and what did it cost the others?

Forgetting is the failure Cascade exists to prevent, so every run ends with the regression
table (domain x stage, plus each domain's drop from its best) and one eval curve per domain
with the stage boundaries marked. Everything here works on plain `RunHistory` data, so it is
tested without a database; `write_report` also accepts a Session and loads the history itself.
Plots use matplotlib's Agg canvas directly (no pyplot, no global backend switch, no display).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cascade.eval.stats import Interval
from cascade.store.history import (
    RegressionRow,
    RegressionTable,
    RunHistory,
    build_regression_table,
    json_safe,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from sqlalchemy.orm import Session

MISSING = "—"
DEFINITIONS = (
    "start: eval before the first stage. after <stage>: the last eval in that stage. "
    "best: the highest eval anywhere in the run. [low-high]: the 95% confidence interval "
    "(Wilson for 0/1 outcomes, bootstrap over prompts for means). final - best: the latest eval "
    "minus best, in percentage points (negative = forgotten); 'outside noise' when final's "
    "interval lies wholly below best's (non-overlapping intervals), 'within noise' otherwise."
)


def format_score(value: float | None, interval: Interval | None = None) -> str:
    if value is None:
        return MISSING
    text = f"{100 * value:.1f}%"
    if interval is not None:
        text += f" [{100 * interval[0]:.1f}-{100 * interval[1]:.1f}]"
    return text


def format_drop(value: float | None, outside: bool | None = None) -> str:
    if value is None:
        return MISSING
    points = 100 * value
    text = "0.0 pp" if abs(points) < 0.05 else f"{points:+.1f} pp"
    if outside is not None and points <= -0.05:
        text += ", outside noise" if outside else ", within noise"
    return text


def table_cells(table: RegressionTable) -> list[list[str]]:
    """The table as display strings, one list per domain, aligned with `table.columns`."""
    cells = []
    for row in table.rows:
        after_ci = row.after_ci or [None] * len(row.after)
        cells.append(
            [
                row.domain,
                format_score(row.start, row.start_ci),
                *(format_score(v, ci) for v, ci in zip(row.after, after_ci, strict=True)),
                format_score(row.best, row.best_ci),
                format_drop(row.final_minus_best, row.drop_outside_noise),
            ]
        )
    return cells


def render_markdown(table: RegressionTable) -> str:
    """A GitHub-flavoured markdown table (no title; `write_report` adds one)."""
    lines = [
        "| " + " | ".join(table.columns) + " |",
        "|" + "|".join([":---", *["---:"] * (len(table.columns) - 1)]) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_cells(table)]
    return "\n".join(lines) + "\n"


def render_regression_table(table: RegressionTable, title: str | None = "Regression table") -> Table:
    """The same table for a terminal; drops outside noise (or, without intervals, of more than
    one point) are shown in red."""
    out = Table(title=title, caption=DEFINITIONS, caption_justify="left")
    for i, column in enumerate(table.columns):
        out.add_column(column, justify="left" if i == 0 else "right", no_wrap=True)
    for row, cells in zip(table.rows, table_cells(table), strict=True):
        drop, outside = row.final_minus_best, row.drop_outside_noise
        bad = outside if outside is not None else drop is not None and drop < -0.01
        style = "red" if bad else "green"
        out.add_row(*(Text(c) for c in cells[:-1]), Text(cells[-1], style=style))
    return out


# --------------------------------------------------------------------------- curves


def _safe_name(domain: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", domain) or "domain"


def _draw_curves(ax: Axes, history: RunHistory, domains: list[str], shade: str | None) -> None:
    for domain in domains:
        points = history.evals_of(domain)
        if not points:
            continue
        (line,) = ax.plot(
            [p.global_step for p in points],
            [100 * p.score for p in points],
            marker="o",
            markersize=3,
            linewidth=1.5,
            label=domain,
        )
        shown = [(p.global_step, p.interval()) for p in points]
        band = [(g, ci) for g, ci in shown if ci is not None]
        if band:  # the confidence interval of every eval, as a band around the curve
            ax.fill_between(
                [g for g, _ in band],
                [100 * ci[0] for _, ci in band],
                [100 * ci[1] for _, ci in band],
                color=line.get_color(),
                alpha=0.15,
                linewidth=0,
            )
    label_at = ax.get_xaxis_transform()  # x in data units, y in axes fraction
    for stage in history.stages:
        if stage.start_global_step is None:
            continue
        ax.axvline(stage.start_global_step, color="0.4", linestyle="--", linewidth=0.8)
        ax.text(stage.start_global_step, 1.01, f" {stage.label}", transform=label_at, fontsize=8, va="bottom")
        if shade is not None and stage.domain == shade and stage.end_global_step is not None:
            ax.axvspan(stage.start_global_step, stage.end_global_step, color="tab:blue", alpha=0.07)
    scores = [e.score for e in history.evals if e.domain in domains]
    if scores and 0.0 <= min(scores) and max(scores) <= 1.0:
        ax.set_ylim(-3, 103)
    ax.set_xlabel("global step")
    ax.set_ylabel("eval score (%)")
    ax.grid(alpha=0.3)
    if scores:
        ax.legend(loc="lower left", fontsize=8)


def _save_figure(history: RunHistory, domains: list[str], shade: str | None, title: str, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    _draw_curves(ax, history, domains, shade)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=110, format="png")
    return path


def plot_curves(history: RunHistory, out_dir: str | Path) -> dict[str, Path]:
    """`curves_<domain>.png` per domain (its own stages shaded) and the combined `curves.png`.

    Returns domain -> path, plus the key "" for the combined figure.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = history.cascade_name or "run"
    paths = {
        domain: _save_figure(
            history, [domain], domain, f"{name}: {domain} eval", out / f"curves_{_safe_name(domain)}.png"
        )
        for domain in history.domains
    }
    paths[""] = _save_figure(history, history.domains, None, f"{name}: eval by domain", out / "curves.png")
    return paths


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class ReportFiles:
    regression_md: Path
    regression_json: Path
    metrics_json: Path
    curves: Path
    domain_curves: dict[str, Path] = field(default_factory=dict)


def _write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(json_safe(data), indent=1, allow_nan=False) + "\n")
    return path


def write_report(source: Session | RunHistory, run_id: int | None, out_dir: str | Path) -> ReportFiles:
    """Write the regression table (.md, .json), the eval curves and metrics.json into `out_dir`.

    `source` is a `RunHistory`, or a Session from which run `run_id`'s history is loaded.
    """
    if isinstance(source, RunHistory):
        history = source
        if run_id is not None and history.run_id is not None and run_id != history.run_id:
            raise ValueError(f"history is of run {history.run_id}, not {run_id}")
    else:
        if run_id is None:
            raise ValueError("run_id is required when reading the history from a session")
        from cascade.store.repo import load_history

        history = load_history(source, run_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = build_regression_table(history)
    heading = f"# Regression table: {history.cascade_name or 'cascade'}"
    if history.run_id is not None:
        heading += f", run {history.run_id}"
    md = out / "regression_table.md"
    md.write_text(f"{heading}\n\n{render_markdown(table)}\n{DEFINITIONS}\n")
    regression_json = _write_json(out / "regression_table.json", table.to_dict())
    metrics = _write_json(out / "metrics.json", {**history.to_dict(), "regression_table": table.to_dict()})
    curves = plot_curves(history, out)
    combined = curves.pop("")
    return ReportFiles(md, regression_json, metrics, combined, curves)


def load_regression_table(report_dir: str | Path) -> RegressionTable:
    data = json.loads((Path(report_dir) / "regression_table.json").read_text())
    stages = list(data["stages"])
    rows = [
        RegressionRow(
            domain=r["domain"],
            start=r["start"],
            after=[r["after"].get(label) for label in stages],
            best=r["best"],
            best_global_step=r["best_global_step"],
            final=r["final"],
            start_ci=_interval(r.get("start_ci")),
            after_ci=[_interval((r.get("after_ci") or {}).get(label)) for label in stages],
            best_ci=_interval(r.get("best_ci")),
            final_ci=_interval(r.get("final_ci")),
        )
        for r in data["rows"]
    ]
    return RegressionTable(stage_labels=stages, rows=rows, metric=data.get("metric"))


def _interval(value: Any) -> Interval | None:
    return None if value is None else (float(value[0]), float(value[1]))


def print_regression_table(report_dir: str | Path, console: Console | None = None) -> None:
    """Print a finished run's table (from its report directory) to the terminal."""
    (console or Console()).print(render_regression_table(load_regression_table(report_dir)))

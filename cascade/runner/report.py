"""The end-of-run report: did each stage help its domain, and what did it cost the others?

Forgetting is the failure Cascade exists to prevent, so every run ends with the regression
table (domain x stage, plus each domain's drop from its best), one eval curve per domain with
the stage boundaries marked, and the training curves (reward, KL, distillation loss, lambda,
completion length, clip fraction, entropy by global step: whichever the steps recorded), for
the whole run and per stage. Everything here works on plain `RunHistory` data, so it is tested
without a database; `write_report` also accepts a Session and loads the history itself. Plots
use matplotlib's Agg canvas directly (no pyplot, no global backend switch, no display).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from cascade.eval.stats import Interval
from cascade.store.history import (
    RegressionRow,
    RegressionTable,
    RunHistory,
    StageSpan,
    StepPoint,
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


def gate_phases(history: RunHistory) -> list[dict[str, Any]]:
    """The MOPD phases the regression gate inserted (steps marked `gate_phase`), one per run of
    consecutive such steps: the stage, the phase's steps and global steps."""
    labels = {s.index: s.label for s in history.stages}
    phases: list[dict[str, Any]] = []
    for p in history.steps:
        if not p.metrics.get("gate_phase"):
            continue
        last = phases[-1] if phases else None
        if (
            last is not None
            and last["stage_index"] == p.stage_index
            and last["last_global_step"] == p.global_step - 1
        ):
            last["last_global_step"] = p.global_step
            last["steps"] += 1
        else:
            phases.append(
                {
                    "stage_index": p.stage_index,
                    "stage": labels.get(p.stage_index),
                    "steps": 1,
                    "first_global_step": p.global_step,
                    "last_global_step": p.global_step,
                }
            )
    return phases


def gate_phase_text(phases: list[dict[str, Any]]) -> str:
    """One line per inserted phase, under the regression table ("" when there was none)."""
    return "".join(
        f"Regression gate: in stage '{ph['stage']}', an MOPD phase of {ph['steps']} steps (global steps "
        f"{ph['first_global_step']}-{ph['last_global_step']}) distilled fallen domains from their best "
        "checkpoints (the decision and its evidence: the stage's gate_opened / gate_closed events).\n"
        for ph in phases
    )


def render_regression_table(
    table: RegressionTable, title: str | None = "Regression table"
) -> RegressionTableView:
    """The same table for a terminal (a rich renderable that fits the console's width); drops
    outside noise (or, without intervals, of more than one point) are shown in red."""
    return RegressionTableView(table, title)


def _stacked(cell: str) -> str:
    """A cell on two lines: the score above its interval, the drop above its noise flag."""
    if cell.endswith("]") and " [" in cell:
        score, interval = cell.split(" [", 1)
        return f"{score}\n[{interval}"
    return cell.replace(", ", "\n", 1)


def _lines_width(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


class RegressionTableView:
    """The regression table as rich renders it: each score above its interval (two lines), and
    when the columns do not fit the console's width, the stage columns split over several tables
    that each repeat the domain column, so no domain name, score or interval is ever cut. Every
    text is plain `Text` (no rich markup: a stage named `[x]` or the legend's `[low-high]` print
    as they are)."""

    def __init__(self, table: RegressionTable, title: str | None = "Regression table") -> None:
        self.table = table
        self.title = title
        self.headers = list(table.columns)
        self.rows: list[tuple[list[str], str]] = []
        for row, cells in zip(table.rows, table_cells(table), strict=True):
            drop, outside = row.final_minus_best, row.drop_outside_noise
            bad = outside if outside is not None else drop is not None and drop < -0.01
            self.rows.append(([cells[0], *(_stacked(c) for c in cells[1:])], "red" if bad else "green"))

    def _width(self, column: int, whole_header: bool) -> int:
        """A column's text width: its widest cell line, and its header whole or its widest word."""
        header = self.headers[column]
        head = cell_len(header) if whole_header else max(cell_len(w) for w in header.split() or [""])
        cells = [cells[column] for cells, _ in self.rows]
        return max([head, *(_lines_width(c) for c in cells)])

    @staticmethod
    def _table_width(widths: list[int]) -> int:
        return sum(w + 3 for w in widths) + 1  # padding 1 + 1 and a border per column, one more edge

    def chunks(self, max_width: int) -> list[tuple[list[int], list[int]]]:
        """The data columns (all but the domain) of each table to print, with every column's text
        width: one table when it fits `max_width`, else as few as fit (at least one data column each)."""
        n = len(self.headers)
        for whole in (True, False):
            widths = [self._width(i, whole) for i in range(n)]
            if self._table_width(widths) <= max_width:
                return [(list(range(1, n)), widths)]
        out: list[tuple[list[int], list[int]]] = []
        current: list[int] = []
        for i in range(1, n):
            if current and self._table_width([widths[0], *(widths[c] for c in [*current, i])]) > max_width:
                out.append((current, widths))
                current = []
            current.append(i)
        if current:
            out.append((current, widths))
        return out

    def tables(self, max_width: int) -> list[Table]:
        parts = self.chunks(max_width)
        out = []
        for k, (columns, widths) in enumerate(parts):
            title = self.title
            if title is not None and len(parts) > 1:
                title += f" ({k + 1}/{len(parts)})"
            last = k == len(parts) - 1
            t = Table(
                title=None if title is None else Text(title, style="table.title"),
                caption=Text(DEFINITIONS, style="table.caption") if last else None,
                caption_justify="left",
                show_lines=any("\n" in c for cells, _ in self.rows for c in cells),
            )
            for i in (0, *columns):
                t.add_column(
                    Text(self.headers[i]),
                    justify="left" if i == 0 else "right",
                    width=widths[i],
                    overflow="fold",
                )
            final = len(self.headers) - 1
            for cells, style in self.rows:
                t.add_row(*(Text(cells[i], style=style if i == final else "") for i in (0, *columns)))
            out.append(t)
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for k, t in enumerate(self.tables(options.max_width)):
            if k:
                yield Text("")
            yield t


# --------------------------------------------------------------------------- curves


def _safe_name(domain: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", domain) or "domain"


def _mark_stages(ax: Axes, stages: list[StageSpan], shade: str | None, fontsize: int = 8) -> None:
    """A dashed line and the stage's label at each stage's start; `shade`'s own stages shaded."""
    label_at = ax.get_xaxis_transform()  # x in data units, y in axes fraction
    for stage in stages:
        if stage.start_global_step is None:
            continue
        ax.axvline(stage.start_global_step, color="0.4", linestyle="--", linewidth=0.8)
        ax.text(
            stage.start_global_step,
            1.01,
            f" {stage.label}",
            transform=label_at,
            fontsize=fontsize,
            va="bottom",
        )
        if shade is not None and stage.domain == shade and stage.end_global_step is not None:
            ax.axvspan(stage.start_global_step, stage.end_global_step, color="tab:blue", alpha=0.07)


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
    _mark_stages(ax, history.stages, shade)
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


# --------------------------------------------------------------------------- training curves

TRAINING_METRICS = (
    ("reward_mean", "reward (mean)"),
    ("kl", "KL to the reference"),
    ("loss_distill", "distillation loss"),
    ("lambda", "lambda (distillation weight)"),
    ("completion_tokens_mean", "completion length (tokens)"),
    ("clip_fraction", "clip fraction"),
    ("entropy", "entropy"),
)
"""(step metric, panel title) of the training curves, in panel order; a panel is drawn only when
the steps drawn recorded that metric (a finite number at one step at least)."""


def _series(steps: list[StepPoint], key: str) -> tuple[list[int], list[float]]:
    """(global steps, values) of `key` where a step recorded it as a finite number."""
    xs, ys = [], []
    for s in steps:
        value = s.metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(s.global_step)
            ys.append(float(value))
    return xs, ys


def training_metrics(steps: list[StepPoint]) -> list[str]:
    """The `TRAINING_METRICS` these steps recorded, in panel order."""
    return [key for key, _ in TRAINING_METRICS if _series(steps, key)[0]]


def _stage_runs(history: RunHistory, steps: list[StepPoint]) -> Iterator[tuple[StageSpan, list[StepPoint]]]:
    for stage in history.stages:
        mine = [s for s in steps if s.stage_index == stage.index]
        if mine:
            yield stage, mine


def _save_training_figure(
    history: RunHistory, steps: list[StepPoint], stages: list[StageSpan], title: str, path: Path
) -> Path | None:
    """One panel per recorded metric (two columns), one line per stage; None when there is none."""
    keys = training_metrics(steps)
    if not keys:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 1 if len(keys) == 1 else 2
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(5.0 * cols, 0.6 + 2.7 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    titles = dict(TRAINING_METRICS)
    colors = {s.index: f"C{i % 10}" for i, s in enumerate(history.stages)}
    starts = [s.start_global_step for s in stages if s.start_global_step is not None]
    low = min([*starts, *(s.global_step for s in steps)])
    high = max(s.global_step for s in steps)
    for ax, key in zip(axes, keys, strict=False):
        for stage, mine in _stage_runs(history, steps):
            xs, ys = _series(mine, key)
            if xs:
                marker = "o" if len(xs) <= 40 else None
                ax.plot(
                    xs,
                    ys,
                    color=colors[stage.index],
                    linewidth=1.2,
                    marker=marker,
                    markersize=2.5,
                    label=stage.label,
                )
        if len(stages) > 1:
            _mark_stages(ax, stages, None, fontsize=7)
        ax.set_title(titles[key], fontsize=9, loc="left", pad=12 if len(stages) > 1 else 4)
        ax.set_xlim(low - 0.5, high + 0.5)  # every panel on the same axis, whatever it recorded
        ax.set_xlabel("global step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=110, format="png")
    return path


def plot_training_curves(history: RunHistory, out_dir: str | Path) -> dict[str, Path]:
    """`training.png` (the whole run, stage boundaries marked) and `training_<stage>.png` per
    stage: a panel per `TRAINING_METRICS` entry the steps recorded, by global step.

    Returns stage label -> path, plus the key "" for the whole run; empty when no step recorded
    any of those metrics.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = history.cascade_name or "run"
    paths: dict[str, Path] = {}
    whole = _save_training_figure(
        history, history.steps, history.stages, f"{name}: training", out / "training.png"
    )
    if whole is None:
        return paths
    used: set[str] = set()
    for stage, mine in _stage_runs(history, history.steps):
        file = f"training_{_safe_name(stage.label)}"
        if file in used:  # two labels that read the same once made safe
            file += f"_{stage.index}"
        used.add(file)
        title = f"{name}: stage {stage.label} ({stage.domain}) training"
        saved = _save_training_figure(history, mine, [stage], title, out / f"{file}.png")
        if saved is not None:
            paths[stage.label] = saved
    paths[""] = whole
    return paths


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class ReportFiles:
    regression_md: Path
    regression_json: Path
    metrics_json: Path
    curves: Path
    domain_curves: dict[str, Path] = field(default_factory=dict)
    training_curves: Path | None = None
    """`training.png`: the step metrics of the whole run (None when no step recorded one)."""
    stage_training_curves: dict[str, Path] = field(default_factory=dict)
    """Stage label -> `training_<stage>.png`."""


def _write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(json_safe(data), indent=1, allow_nan=False) + "\n")
    return path


def write_report(source: Session | RunHistory, run_id: int | None, out_dir: str | Path) -> ReportFiles:
    """Write the regression table (.md, .json), the eval curves, the training curves and
    metrics.json into `out_dir`.

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
    phases = gate_phases(history)
    gate = gate_phase_text(phases)
    md.write_text(f"{heading}\n\n{render_markdown(table)}\n{gate + chr(10) if gate else ''}{DEFINITIONS}\n")
    regression_json = _write_json(out / "regression_table.json", {**table.to_dict(), "gate_phases": phases})
    metrics = _write_json(out / "metrics.json", {**history.to_dict(), "regression_table": table.to_dict()})
    curves = plot_curves(history, out)
    combined = curves.pop("")
    training = plot_training_curves(history, out)
    whole = training.pop("", None)
    return ReportFiles(md, regression_json, metrics, combined, curves, whole, training)


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
    """Print a finished run's table (from its report directory) to the terminal, fitted to its
    width."""
    console = console or Console()
    console.print(render_regression_table(load_regression_table(report_dir)))
    phases = json.loads((Path(report_dir) / "regression_table.json").read_text()).get("gate_phases") or []
    if phases:
        console.print(gate_phase_text(phases).rstrip("\n"), markup=False)

"""The agent stage's regression table, with and without distillation (`make ablation-agent`).

Reads the reports of the two runs of one config (`cascade run CONFIG` and `cascade run CONFIG
--no-distill`: same seed, same data, the only difference the distillation terms) and writes
`bench/results/agent_cascade.json` (both tables, the agent eval's tool use after each stage,
the exact config text, the model's SFT log summary, the commit) and `agent_cascade.md` (both
tables and, per domain, what the agent stage did to it with and without distillation).

Usage: `.venv/bin/python bench/agent_cascade.py [CONFIG]` (default examples/agent-cascade.yaml).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cascade.config import load_cascade_config
from cascade.runner.report import load_regression_table, render_markdown
from cascade.store.history import RegressionTable

ROOT = Path(__file__).resolve().parents[1]


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def _agent_tool_use(report_dir: Path) -> list[dict[str, Any]]:
    """Every agent eval's calls per task and tool-error rate (from the report's metrics.json)."""
    metrics = json.loads((report_dir / "metrics.json").read_text())
    out = []
    for e in metrics.get("evals", []):
        if e.get("domain") != "agent":
            continue
        m = e.get("metrics") or {}
        out.append(
            {
                "global_step": e.get("global_step"),
                "success": e.get("score"),
                **{k: m[k]["value"] for k in ("calls_per_task", "tool_error_rate") if k in m},
            }
        )
    return out


def stage_effect(table: RegressionTable, stage: int) -> dict[str, float | None]:
    """Per domain: its score after `stage` minus after the stage before (pp as a fraction)."""
    out: dict[str, float | None] = {}
    for row in table.rows:
        before, after = row.after[stage - 1], row.after[stage]
        out[row.domain] = None if before is None or after is None else after - before
    return out


def _shown(path: Path) -> str:
    """The path as the results file shows it: relative to the repository when inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="examples/agent-cascade.yaml")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "agent_cascade"))
    args = parser.parse_args()
    cfg = load_cascade_config(Path(args.config))
    runs = {"distill": cfg.output_dir / cfg.name, "no_distill": cfg.output_dir / f"{cfg.name}-no-distill"}
    missing = [str(d) for d in runs.values() if not (d / "report" / "regression_table.json").exists()]
    if missing:
        print(
            f"error: no finished report in {', '.join(missing)} (run `make ablation-agent`)", file=sys.stderr
        )
        return 1
    tables = {k: load_regression_table(d / "report") for k, d in runs.items()}
    agent_stage = next(i for i, s in enumerate(cfg.stages) if s.domain == "agent")
    effects = {k: stage_effect(t, agent_stage) for k, t in tables.items()} if agent_stage else {}
    sft_log = cfg.model.path / "sft_log.json"
    sft = json.loads(sft_log.read_text()) if sft_log.exists() else {}
    result = {
        "config_path": _shown(Path(args.config)),
        "config": Path(args.config).read_text(),
        "commit": _commit(),
        "model": {k: sft.get(k) for k in ("steps", "stopped_by", "final_scores", "n_parameters")},
        "tables": {k: t.to_dict() for k, t in tables.items()},
        "agent_stage_effect": effects,
        "agent_tool_use": {k: _agent_tool_use(d / "report") for k, d in runs.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Agent cascade: {' -> '.join(s.label for s in cfg.stages)}", ""]
    shown = _shown(Path(args.config))
    lines += [f"Config `{shown}`, commit `{result['commit']}`, model {cfg.model.path}.", ""]
    for key, title in (("distill", "With distillation"), ("no_distill", "Without distillation")):
        lines += [f"## {title}", "", render_markdown(tables[key])]
    if effects:
        lines += ["## What the agent stage did to each domain (after agent - after the stage before)", ""]
        lines += ["| domain | with distillation | without |", "|:---|---:|---:|"]
        for domain in effects["distill"]:
            cells = [effects[k][domain] for k in ("distill", "no_distill")]
            lines.append(
                f"| {domain} | "
                + " | ".join("—" if c is None else f"{100 * c:+.1f} pp" for c in cells)
                + " |"
            )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Drill: the demo's first steps, run twice as `cascade run` processes on torch's default threads,
once with the cores loaded by two busy-looping processes, leave the same store: every step metric
but the wall-clock ones, and every eval with its intervals, equal with `==`.

The other e2e tests run torch on one thread (fast on a shared machine), where the order of a
kernel's additions cannot depend on thread timing, and on the random model, whose all-zero
rewards leave GRPO nothing to train on. This one runs the trained tiny model on two threads, as
`make demo` does; while the learner's backward added rows with atomic float adds it failed
within the first steps (`tests/integration/test_learner_determinism.py` is the step-level drill).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from cpu_load import cores_loaded

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def _demo_start(model: Path, tmp_path: Path) -> Path:
    """The demo's math stage, cut to STEPS steps, with smaller evals."""
    data = yaml.safe_load((ROOT / "examples" / "tiny-cascade.yaml").read_text())
    data["model"]["path"] = str(model)
    data["output_dir"] = str(tmp_path / "runs")
    data["stages"] = data["stages"][:1]
    data["stages"][0]["advance"]["max_steps"] = STEPS
    data["stages"][0]["eval"]["every"] = 5
    for domain in data["domains"]:
        domain["prompts"]["n_eval"] = 64
    path = tmp_path / "cascade.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(config: Path, run_dir: Path) -> None:
    cmd = [sys.executable, "-m", "cascade.cli", "run", str(config)]
    cmd += ["--run-dir", str(run_dir), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_seeded_run_is_the_same_with_the_cores_loaded(
    e2e, trained_tiny_model: Path, tmp_path: Path
) -> None:
    config = _demo_start(trained_tiny_model, tmp_path)
    _run(config, tmp_path / "idle")
    with cores_loaded():
        _run(config, tmp_path / "loaded")
    idle = e2e.rows(e2e.sqlite_url(tmp_path / "idle"))
    loaded = e2e.rows(e2e.sqlite_url(tmp_path / "loaded"))
    assert len(idle.steps) == STEPS
    assert sum(m["skipped_update"] == 0.0 for *_, m in idle.steps) >= STEPS - 1  # GRPO trained
    for a, b in zip(idle.without_timing(), loaded.without_timing(), strict=True):
        assert a == b, f"global step {a[2]} differs under load"
    assert idle.evals == loaded.evals
    assert idle.eval_metrics == loaded.eval_metrics

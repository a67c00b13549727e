"""The sharded learner against one process, on the same batches: `tests/sharded_equivalence.py`
under `torchrun --nproc-per-node 2` (gloo on this CPU) drives three updates of RL with a KL
reference plus a distillation term (sampled, top-k, full) through `ShardedTrainer` and
`LocalTrainer` side by side, then resumes a 2-rank checkpoint on 1 process and a 1-process
checkpoint on 2 ranks. Step metrics (losses, gradient norms, distillation and GRPO metrics) and
the updated weights must agree within 1e-5."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.parallel.launch import torchrun_argv

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def report(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("sharded")
    out = work / "report.json"
    argv = torchrun_argv(2, "tests.sharded_equivalence", [str(random_tiny_model), str(work), str(out)])
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


def test_two_ranks_make_the_update_of_one_process(report: dict) -> None:
    steps = report["steps"]
    assert [s["loss"] for s in steps] == ["sampled", "topk", "full"]
    for s in steps:
        assert s["metric_diff"] <= TOLERANCE, s
        assert s["weights_diff"] <= TOLERANCE, s
        # a real update: RL and distillation both moved the weights
        assert s["grad_norm"][0] > 0.1 and abs(s["loss_distill"][0]) > 1e-3, s
        assert {"loss_rl", "loss_distill", "grad_norm_rl", "grad_norm_distill", "grpo_kl"} <= set(s["keys"])


def test_a_two_rank_checkpoint_resumes_on_one_process(report: dict) -> None:
    resumed = report["two_to_one"]
    assert resumed["sharded_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one shard per rank
    assert resumed["metric_diff"] <= TOLERANCE and resumed["weights_diff"] <= TOLERANCE, resumed


def test_a_one_process_checkpoint_resumes_on_two_ranks(report: dict) -> None:
    resumed = report["one_to_two"]
    assert resumed["metric_diff"] <= TOLERANCE and resumed["weights_diff"] <= TOLERANCE, resumed


def test_cascade_run_nproc_is_refused_below_one(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cascade.cli",
            "run",
            str(ROOT / "examples" / "tiny-cascade.yaml"),
            "--nproc",
            "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--nproc must be at least 1" in proc.stderr

"""The learner benchmarks on CPU ranks. `bench/learner_scale.py` in its quick mode on the random
tiny model: the 1-rank learner in the benchmark's process, then 2 ranks under torchrun (gloo),
each holding its FSDP2 shard; each of the 2 ranks must hold about half of one rank's parameters,
gradients and optimizer state, and their first update must be the one rank's (same loss, same
gradient norm). And `bench/gpu_sharded_check.py`, the GPU machines' multi-rank check, run here
on 2 CPU ranks so that it cannot rot unseen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("params", "grads", "optimizer", "total")


def test_two_ranks_hold_half_of_one_rank_each(random_tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "learner_scale.json"
    argv = [sys.executable, str(ROOT / "bench" / "learner_scale.py"), "--quick"]
    argv += ["--model", str(random_tiny_model), "--out", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())

    one, two = result["learner"]
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert len(one["per_rank_bytes"]) == 1 and len(two["per_rank_bytes"]) == 2
    whole = one["per_rank_bytes"][0]
    assert whole["grads"] == whole["params"]  # every parameter trained, float32
    assert whole["optimizer"] >= 2 * whole["params"]  # AdamW: exp_avg + exp_avg_sq (+ step)
    for rank in two["per_rank_bytes"]:
        for part in PARTS:
            assert 0.4 * whole[part] <= rank[part] <= 0.65 * whole[part], (part, rank, whole)
    # the shards add up to the whole model (FSDP2 pads uneven dim-0 splits at most a row per rank)
    assert sum(r["params"] for r in two["per_rank_bytes"]) == pytest.approx(whole["params"], rel=0.01)
    assert result["per_rank_total_vs_one_rank"]["2"] == [
        pytest.approx(r["total"] / whole["total"], abs=1e-4) for r in two["per_rank_bytes"]
    ]
    # rank 0 also holds the full weights that generate (gathered after each update)
    assert two["driver_full_copy_bytes"] == whole["params"]

    # the same batch, the same first update
    assert set(one["first_step"]) == {"loss_rl", "loss_distill", "grad_norm"}
    for key, value in one["first_step"].items():
        assert two["first_step"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for case in (one, two):
        assert case["update_s"] > 0 and case["step_s"] >= case["update_s"]
        assert len(case["update_s_each"]) == result["steps"] == 2
    assert result["machine"]["cores"] >= 1 and result["pushes"] == []


def test_gpu_sharded_check_runs_on_two_cpu_ranks(tmp_path: Path) -> None:
    """`bench/gpu_sharded_check.py` (NCCL + bfloat16 on GPUs) in its gloo/float32 form: the same
    code path on 2 CPU ranks, every step within 1e-5 of one process, PASS."""
    out = tmp_path / "sharded_check.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    argv += [str(ROOT / "bench" / "gpu_sharded_check.py"), "--device", "cpu", "--steps", "2"]
    argv += ["--prompts", "4", "--tokens", "8", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS" in proc.stdout.splitlines()
    report = json.loads(out.read_text())
    assert report["backend"] == "gloo" and report["ranks"] == 2 and report["match"] is True
    assert report["steps_checked"] == [0, 1] and report["tolerance_rel"]["grad_norm"] == 1e-5
    assert set(report["sharded"][0]) == {"loss_rl", "loss_distill", "grad_norm"}

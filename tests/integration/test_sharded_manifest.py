"""A sharded learner's checkpoint carries a manifest over every rank's `dcp/` shards: it is
written after `write_shards` returns, and `torch.distributed.checkpoint.save` returns on rank 0
only once every rank's shards are written (`tests/sharded_manifest.py` under `torchrun
--nproc-per-node 2`, gloo on this CPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cascade.parallel.launch import torchrun_argv

ROOT = Path(__file__).resolve().parents[2]


def test_the_manifest_of_a_two_rank_checkpoint_lists_both_ranks_shards(
    random_tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    argv = torchrun_argv(2, "tests.sharded_manifest", [str(random_tiny_model), str(tmp_path), str(out)])
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads(out.read_text())
    assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp", "dcp/.metadata"} <= set(report["listed"])
    assert report["listed"] == report["on_disk"]
    assert report["verified"] is None

"""Run under `torchrun --nproc-per-node 2` by tests/integration/test_sharded_manifest.py.

Rank 0 drives a `ShardedTrainer` (the other rank follows it) and saves one checkpoint: every
rank writes its `dcp/` shards, rank 0 the model directory and, last, the manifest. Writes the
manifest's `dcp/` entries, the shard files on disk and what `verify_checkpoint` says to the JSON
file named by argv[3].

argv: MODEL_DIR WORK_DIR OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from cascade.accel import resolve_learner
from cascade.config import LearnerConfig, StageConfig
from cascade.parallel.launch import start_rank
from cascade.runner.checkpoint import MANIFEST_FILE, verify_checkpoint
from cascade.runner.sharded import ShardedTrainer, follow_driver, release


def main() -> int:
    model, work, out_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    accel = resolve_learner(LearnerConfig(device="cpu"), "float32")
    world, accel = start_rank(accel)
    if not world.driver:
        return follow_driver(world, accel, "float32")
    try:
        trainer = ShardedTrainer(world, accel, "float32")
        trainer.load(model)
        trainer.start_stage(StageConfig.model_validate({"domain": "math"}))
        path = work / "checkpoints" / "step-000001"
        trainer.save(path, generator=torch.Generator(), runner_state={"global_step": 1})
        files = json.loads((path / MANIFEST_FILE).read_text())["files"]
        report = {
            "listed": sorted(f for f in files if f.startswith("dcp/")),
            "on_disk": sorted(p.relative_to(path).as_posix() for p in (path / "dcp").iterdir()),
            "verified": verify_checkpoint(path),
        }
        out_path.write_text(json.dumps(report))
    finally:
        release(world)
    return 0


if __name__ == "__main__":
    sys.exit(main())

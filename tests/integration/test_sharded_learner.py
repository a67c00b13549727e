"""The sharded learner against one process, on the same batches: `tests/sharded_equivalence.py`
under `torchrun --nproc-per-node 2` (gloo on this CPU) drives three updates of RL with a KL
reference and the behaviour correction (its mismatch maximum over ranks), plus a distillation
term (sampled, top-k, full) through `ShardedTrainer` and `LocalTrainer` side by side, then
resumes a 2-rank checkpoint on 1 process and a 1-process checkpoint on 2 ranks. Step metrics
(losses, gradient norms, distillation and GRPO metrics) and the updated weights must agree
within 1e-5. Run a second time with the sharded side in micro-batches (each rank cutting its
share, the vocabulary in chunks): the same bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.parallel.launch import torchrun_argv
from cascade.runner.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5


def _run(model: Path, work: Path, *extra: str) -> dict:
    out = work / "report.json"
    argv = torchrun_argv(2, "tests.sharded_equivalence", [str(model), str(work), str(out), *extra])
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def report(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(random_tiny_model, tmp_path_factory.mktemp("sharded"))


@pytest.fixture(scope="module")
def micro_report(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(random_tiny_model, tmp_path_factory.mktemp("sharded-micro"), "micro")


def test_two_ranks_in_micro_batches_make_the_update_of_one_process_in_one_pass(micro_report: dict) -> None:
    test_two_ranks_make_the_update_of_one_process(micro_report)
    assert all(s["micro_batches"] > 1 for s in micro_report["steps"])
    resumed = micro_report["one_to_two"]
    assert resumed["metric_diff"] <= TOLERANCE and resumed["weights_diff"] <= TOLERANCE, resumed


def test_two_ranks_make_the_update_of_one_process(report: dict) -> None:
    steps = report["steps"]
    assert [s["loss"] for s in steps] == ["sampled", "topk", "full"]
    for s in steps:
        assert s["metric_diff"] <= TOLERANCE, s
        assert s["weights_diff"] <= TOLERANCE, s
        # a real update: RL and distillation both moved the weights
        assert s["grad_norm"][0] > 0.1 and abs(s["loss_distill"][0]) > 1e-3, s
        assert {"loss_rl", "loss_distill", "grad_norm_rl", "grad_norm_distill", "grpo_kl"} <= set(s["keys"])
        assert {"grpo_mismatch_max", "grpo_mismatch_mean", "grpo_behaviour_dropped_frac"} <= set(s["keys"])


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


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of `rank` of the sharded run writing to `run_dir` (from /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run_dir).encode() in cmdline and f"RANK={rank}".encode() in environ:
            if b"torch.distributed.run" not in cmdline:
                return int(proc.name)
    return None


def test_a_killed_rank_ends_the_run_and_it_resumes_on_one_process(
    random_tiny_model: Path, tmp_path: Path
) -> None:
    """kill -9 of a follower rank mid-stage: torchrun ends the whole group (no rank hangs in a
    collective), the driver's resume hint is recorded, and `cascade run --resume --run-dir DIR`
    on one process finishes the cascade from the last sharded checkpoint: every global step once,
    each step's trained samples those of an uninterrupted run."""
    import os
    import signal
    import time

    import yaml

    grpo = {"group_size": 4, "prompts_per_step": 4, "budget": {"max_new_tokens": 8}}
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 32, "n_eval": 4}
    data = {
        "name": "killed",
        "seed": 0,
        "model": {"path": str(random_tiny_model)},
        "domains": [{"name": "if", "prompts": prompts}, {"name": "math", "prompts": prompts}],
        "stages": [
            {"domain": "if", "grpo": grpo, "advance": {"max_steps": 3}, "eval": {"every": 3}},
            {
                "domain": "math",
                "grpo": grpo,
                "distill": {"loss": "sampled", "prompts_per_teacher": 4},
                "advance": {"max_steps": 4},
                "eval": {"every": 4},
            },
        ],
        "checkpoint": {"every": 1, "keep_last": 2},
        "lease": {"heartbeat_s": 0.5, "expiry_s": 3},
        "rollout": {"seeding": "per_request"},
        "output_dir": str(tmp_path / "runs"),
    }
    cfg = tmp_path / "cascade.yaml"
    cfg.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "sharded"
    log = tmp_path / "run.log"

    def start(*flags: str) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable,
            "-m",
            "cascade.cli",
            "run",
            "--no-progress",
            "--run-dir",
            str(run_dir),
            *flags,
        ]
        return subprocess.Popen(
            argv, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
        )

    def trained() -> list[dict]:
        path = run_dir / "samples.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    run = start(str(cfg), "--nproc", "2")
    try:
        deadline = time.monotonic() + 240
        while len(trained()) < 4 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(trained()) >= 4, log.read_text()[-3000:]
        follower = _rank_pid(run_dir, 1)
        assert follower is not None
        os.kill(follower, signal.SIGKILL)
        assert run.wait(timeout=120) != 0  # the group ended, no rank left waiting
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=10)
    assert _rank_pid(run_dir, 0) is None and _rank_pid(run_dir, 1) is None
    last = latest_checkpoint(run_dir / "checkpoints")  # complete ones only (a .tmp may be left)
    assert last is not None
    assert sorted(p.name for p in (last / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    time.sleep(3.5)  # a lease left by a killed holder expires
    resumed = start("--resume")
    assert resumed.wait(timeout=240) == 0, log.read_text()[-3000:]
    assert "resumed from step-" in log.read_text()
    steps = [t["global_step"] for t in trained()]
    assert steps == list(range(1, 8)), steps

    reference = tmp_path / "reference"
    proc = subprocess.run(
        [sys.executable, "-m", "cascade.cli", "run", str(cfg), "--no-progress", "--run-dir", str(reference)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = [json.loads(line) for line in (reference / "samples.jsonl").read_text().splitlines()]
    assert trained() == expected

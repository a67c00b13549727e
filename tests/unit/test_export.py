"""`cascade export`: a run's checkpoint as a plain Hugging Face model directory. The export loads
with transformers alone and computes the checkpoint's logits exactly; it holds nothing only a
resume reads; `step-N` and `best:<domain>` pick what the run keeps; a checkpoint that does not
verify, or an OUT_DIR in the way, is refused in one line and nothing is written."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cascade.cli.common import quiet_hub_progress
from cascade.cli.main import main
from cascade.config import parse_cascade_config
from cascade.model.loading import Policy, load_trainable_policy
from cascade.runner.checkpoint import save_checkpoint, save_model_dir_atomically
from cascade.runner.record import RunRecord, write_record

pytestmark = pytest.mark.usefixtures("torch_one_thread")
quiet_hub_progress()  # the loads' progress bars are not the command's stderr

MODEL_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}
RESUME_FILES = {
    "optimizer.safetensors",
    "master.safetensors",
    "rng.safetensors",
    "runner_state.json",
    "manifest.json",
}
IDS = torch.tensor([[1, 5, 9, 17, 33, 65, 3, 7]])


def _step(policy: Policy, optim: torch.optim.Optimizer) -> None:
    optim.zero_grad(set_to_none=True)
    policy.model(input_ids=IDS, labels=IDS, use_cache=False).loss.backward()
    optim.step()


def _state(step: int, teachers: dict[str, dict]) -> dict:
    return {
        "stage_index": 0,
        "stage_step": step,
        "global_step": step,
        "stage_started": True,
        "teachers": {"teachers": teachers},
        "finished": False,
    }


@pytest.fixture(scope="module")
def run_dir(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of two steps as the runner leaves it: `checkpoints/step-000001` and `step-000002`
    (bfloat16 model directories beside float32 master weights, optimizer, RNG, runner state and
    manifest; step 2 of a sharded learner, with `dcp/` shards), math's best checkpoint in
    `teachers/` (from step 1, named in the registry by a path relative to another directory),
    and run.json. Never written to by the tests."""
    run = tmp_path_factory.mktemp("export") / "runs" / "tiny"
    torch.manual_seed(0)
    policy = load_trainable_policy(random_tiny_model, "bfloat16")
    optim = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    _step(policy, optim)
    teacher = run / "teachers" / "math-g000001"
    save_model_dir_atomically(policy, teacher)
    math = {"math": {"path": "runs/tiny/teachers/math-g000001", "score": 0.5, "step": 1}}
    save_checkpoint(
        run / "checkpoints" / "step-000001",
        policy=policy,
        optimizer=optim,
        generator=gen,
        runner_state=_state(1, math),
    )
    _step(policy, optim)

    def shards(directory: Path) -> None:  # what a sharded learner's ranks write beside the model
        (directory / "dcp").mkdir()
        (directory / "dcp" / "__0_0.distcp").write_bytes(b"shard")
        (directory / "dcp" / ".metadata").write_bytes(b"meta")

    save_checkpoint(
        run / "checkpoints" / "step-000002",
        policy=policy,
        optimizer=None,
        generator=gen,
        runner_state=_state(2, math),
        write_shards=shards,
    )
    cfg = parse_cascade_config(
        {
            "name": "tiny",
            "model": {"path": str(random_tiny_model)},
            "domains": [{"name": "math"}],
            "stages": [{"domain": "math"}],
        }
    )
    write_record(
        run,
        RunRecord.make(config=cfg, distill=True, kind="local", db_url="sqlite://", cascade_id=1, sources={}),
    )
    return run


def _logits(path: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _export(*args: str) -> int:
    return main(["export", *args])


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def test_latest_is_a_plain_model_directory(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "final"
    assert _export(str(run_dir), str(out)) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"exported step-000002 of {run_dir} to {out}: 6 files"), said
    assert "weights in bfloat16" in said
    assert {p.name for p in out.iterdir()} == MODEL_FILES  # no optimizer, RNG, runner state, dcp/
    assert not RESUME_FILES & {p.name for p in out.rglob("*")}
    # loads with transformers alone, and computes what the checkpoint computes
    checkpoint = run_dir / "checkpoints" / "step-000002"
    assert torch.equal(_logits(out), _logits(checkpoint))
    assert not torch.equal(_logits(out), _logits(run_dir / "checkpoints" / "step-000001"))
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert "2+2?" in text
    # every file readable as the umask allows (safetensors writes 0600 whatever the umask)
    mask = os.umask(0o022)
    os.umask(mask)
    want = (0o666 & ~mask) | 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {want}
    assert not list(tmp_path.glob(".*export-tmp"))


def test_step_and_best(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _export(str(run_dir), str(tmp_path / "s1"), "--checkpoint", "step-1") == 0
    assert torch.equal(_logits(tmp_path / "s1"), _logits(run_dir / "checkpoints" / "step-000001"))
    assert capsys.readouterr().out.startswith(f"exported step-000001 of {run_dir} to ")
    assert _export(str(run_dir), str(tmp_path / "best"), "--checkpoint", "best:math") == 0
    said = capsys.readouterr().out
    assert said.startswith(f"exported best:math of {run_dir} (math-g000001: score 0.5 at global step 1)"), (
        said
    )
    assert {p.name for p in (tmp_path / "best").iterdir()} == MODEL_FILES
    assert torch.equal(_logits(tmp_path / "best"), _logits(run_dir / "teachers" / "math-g000001"))

    assert _export(str(run_dir), str(tmp_path / "x"), "--checkpoint", "best:code") == 2
    line = _one_error(capsys)
    assert "'code' has no best checkpoint in step-000002's teacher registry (known: best:math)" in line
    assert _export(str(run_dir), str(tmp_path / "x"), "--checkpoint", "step-7") == 2
    assert "has no checkpoint step-000007 (it has step-000001, step-000002)" in _one_error(capsys)
    assert not (tmp_path / "x").exists()


def test_bad_selector_is_refused_by_the_parser(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        _export(str(run_dir), str(tmp_path / "x"), "--checkpoint", "newest")
    assert info.value.code == 2


def test_damaged_checkpoint_is_refused_in_one_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    weights = run / "checkpoints" / "step-000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, another byte: only the checksum tells
    weights.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert _export(str(run), str(out)) == 2
    line = _one_error(capsys)
    assert line == (
        f"error: {run / 'checkpoints' / 'step-000002'} does not verify: model.safetensors does not match "
        "its checksum in the manifest; step-000001 verifies: --checkpoint step-1"
    )
    assert not out.exists()
    assert not list(tmp_path.glob(".*export-tmp"))

    # a damaged teacher (no manifest: its weights are read)
    teacher = run / "teachers" / "math-g000001" / "config.json"
    teacher.write_text("{not json")
    assert _export(str(run), str(out), "--checkpoint", "best:math") == 2
    line = _one_error(capsys)
    assert "math-g000001 (best:math, from step-000001's teacher registry) does not verify: " in line
    assert "config.json cannot be read" in line


def test_out_dir_in_the_way(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert _export(str(run_dir), str(out)) == 2
    assert _one_error(capsys) == f"error: {out} exists and is not empty: give --force to replace it"
    assert (out / "keep.txt").read_text() == "mine"
    assert _export(str(run_dir), str(out), "--force") == 0
    assert {p.name for p in out.iterdir()} == MODEL_FILES

    empty = tmp_path / "empty"
    empty.mkdir()
    assert _export(str(run_dir), str(empty)) == 0  # an empty directory is no obstacle
    capsys.readouterr()
    assert _export(str(run_dir), str(run_dir.parent), "--force") == 2  # never over the run itself
    assert "holds the run directory" in _one_error(capsys)
    assert (run_dir / "checkpoints" / "step-000002" / "runner_state.json").exists()
    assert _export(str(run_dir), str(run_dir / "checkpoints" / "step-000003")) == 2
    assert "inside the run's checkpoints/" in _one_error(capsys)


def test_run_without_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _export(str(tmp_path / "nothing"), str(tmp_path / "out")) == 2
    assert "is not a run directory" in _one_error(capsys)
    (tmp_path / "run").mkdir()
    assert _export(str(tmp_path / "run"), str(tmp_path / "out")) == 2
    assert "holds no checkpoint" in _one_error(capsys)


def test_the_runs_own_chat_template_goes_with_the_export(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    record = json.loads((run / "run.json").read_text())
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}"
    )
    record["config"]["chat"]["template"] = template
    (run / "run.json").write_text(json.dumps(record))
    out = tmp_path / "out"
    assert _export(str(run), str(out)) == 0
    assert "note: the chat template is the run's" in capsys.readouterr().out
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<user>hi<a>"

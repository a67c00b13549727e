"""The `cascade` command as a user runs it (a subprocess): bad configs exit 2 with exactly one
line on stderr naming the field, never a traceback, and nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_process import one_error_line, run_cli

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, model_path: Path | str = "/nonexistent/model") -> dict[str, Any]:
    return {
        "name": "cli-test",
        "model": {"path": str(model_path)},
        "domains": [{"name": "if"}, {"name": "math"}],
        "stages": [{"domain": "if"}, {"domain": "math"}],
        "output_dir": str(tmp_path / "out"),
    }


def _write(tmp_path: Path, data: Any, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def _bad_group_size(tmp_path: Path) -> dict[str, Any]:
    data = _config(tmp_path)
    data["stages"][1]["grpo"] = {"group_size": 1}
    return data


def _typo(tmp_path: Path) -> dict[str, Any]:
    data = _config(tmp_path)
    data["stages"][0]["evall"] = {"every": 2}
    return data


def _missing_model(tmp_path: Path) -> dict[str, Any]:
    data = _config(tmp_path)
    del data["model"]
    return data


BAD = {
    "group_size": (_bad_group_size, "stages.1.grpo.group_size"),
    "typo": (_typo, "stages.0.evall"),
    "missing_model": (_missing_model, "model"),
}


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_exits_2_with_one_line(tmp_path: Path, command: str, case: str) -> None:
    make, field = BAD[case]
    path = _write(tmp_path, make(tmp_path))
    proc = run_cli(command, str(path))
    line = one_error_line(proc)
    assert f": {field}: " in line
    assert str(path) in line
    assert not (tmp_path / "out").exists(), "a refused config must not create the output dir"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_yaml_exits_2_with_line_and_column(tmp_path: Path, command: str) -> None:
    path = _write(tmp_path, f"name: x\noutput_dir: {tmp_path / 'out'}\nmodel: {{path: /x\n")
    line = one_error_line(run_cli(command, str(path)))
    assert "invalid YAML" in line and "line 4, column 1" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["validate", "run"])
def test_undecodable_file_exits_2(tmp_path: Path, command: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"name: t\xff\xfe\nmodel: {path: /x}\n")
    line = one_error_line(run_cli(command, str(path)))
    assert str(path) in line


def test_validate_ok_and_bad_together(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    good = _write(tmp_path, _config(tmp_path, model), "good.yaml")
    bad = _write(tmp_path, _bad_group_size(tmp_path))
    proc = run_cli("validate", str(good), str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stdout.splitlines() == [f"ok: {good} (cli-test: if -> math)"]
    assert len(proc.stderr.splitlines()) == 1 and "stages.1.grpo.group_size" in proc.stderr


def test_validate_examples() -> None:
    """Every example is a valid config; the paths they name are checked where their models are
    built (`make test` builds models/tiny, not models/tiny-full)."""
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples
    proc = run_cli("validate", "--schema-only", *map(str, examples))
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == len(examples)
    assert all(line.startswith("ok: ") for line in proc.stdout.splitlines())
    if (REPO / "models" / "tiny" / "config.json").exists():
        proc = run_cli("validate", "examples/tiny-cascade.yaml")
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr


QWEN3_0_6B = {  # Qwen/Qwen3-0.6B's config.json, the fields the checks read (no weights needed)
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def test_qwen3_example_passes_the_full_checks_on_a_qwen3_shaped_model(tmp_path: Path) -> None:
    """examples/qwen3-0.6b.yaml with model.path on a directory shaped as Qwen3-0.6B (config.json
    and a tokenizer config with a chat template, no weights): the context check (budgets plus
    prompts within 40,960 positions) and the learner's memory estimate (an 80 GB GPU's share)
    pass. The data files it names are empty stand-ins: `validate` checks that they exist."""
    import json

    data = yaml.safe_load((REPO / "examples" / "qwen3-0.6b.yaml").read_text())
    # the recipe's settings the example promises
    for stage in data["stages"]:
        grpo = stage["grpo"]
        assert 1e-6 <= grpo["learning_rate"] <= 2e-6 and grpo["warmup_steps"] == 0
        assert 8 <= grpo["group_size"] <= 16 and grpo["temperature"] == 1.0
        assert grpo["kl_coef"] == 0 and grpo["max_staleness"] == 0 and grpo["thinking"] is True
        assert grpo["budget"]["max_new_tokens"] >= 8192
        assert (stage["eval"]["temperature"], stage["eval"]["top_p"]) == (0.6, 0.95)
    assert data["learner"]["memory_gib"] <= 79 and data["learner"]["device"] == "cuda"
    assert data["model"]["dtype"] == "bfloat16"

    model = tmp_path / "qwen3-0.6b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_0_6B))
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    data["model"]["path"] = str(model)
    data["output_dir"] = str(tmp_path / "runs")
    for domain in data["domains"]:
        files = domain["prompts"].get("data_files") or {}
        for split, names in files.items():
            files[split] = []
            for name in names:
                stand_in = tmp_path / "data" / Path(name).parent.name / Path(name).name
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.touch()
                files[split].append(str(stand_in))
    path = _write(tmp_path, data, "qwen3-0.6b.yaml")
    proc = run_cli("validate", str(path))
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert proc.stdout == f"ok: {path} (qwen3-0.6b-cascade: if -> math -> code)\n"

    # the same config on a smaller card is refused, naming the setting to change
    data["learner"]["memory_gib"] = 12
    proc = run_cli("validate", str(_write(tmp_path, data, "small.yaml")))
    assert proc.returncode == 2 and "needs about" in proc.stderr and "learner.memory_gib" in proc.stderr


def test_print_config_validate(tmp_path: Path) -> None:
    """`validate --print-config`: each config resolved (defaults filled in, paths absolute) as one
    YAML document per file, nothing else on stdout; the text loads back as the same config."""
    from cascade.config import load_cascade_config, parse_cascade_config

    examples = [REPO / "examples" / "tiny-cascade.yaml", REPO / "examples" / "qwen3-0.6b.yaml"]
    proc = run_cli("validate", "--schema-only", "--print-config", *map(str, examples), cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    assert len(docs) == 2
    tiny = docs[0]
    assert tiny["model"]["path"] == str(REPO / "models" / "tiny")  # from the file's directory, absolute
    assert tiny["output_dir"] == str(REPO / "runs")
    assert tiny["checkpoint"] == {"every": 20, "keep_last": 2}
    assert tiny["lease"] == {"heartbeat_s": 5.0, "expiry_s": 30.0}  # defaults filled in
    assert tiny["stages"][0]["grpo"]["clip_eps_high"] == 0.28
    for doc, example in zip(docs, examples, strict=True):
        assert parse_cascade_config(doc) == load_cascade_config(example)
    assert list(tmp_path.iterdir()) == []


def test_print_config_run_applies_the_flags_and_runs_nothing(tmp_path: Path) -> None:
    data = _config(tmp_path, tmp_path / "no-model")
    path = _write(tmp_path, data, "c.yaml")
    proc = run_cli(
        "run", str(path), "--print-config", "--seed", "7", "--device", "cpu", "--track", "tensorboard"
    )
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["seed"] == 7 and cfg["learner"]["device"] == "cpu"
    assert cfg["tracking"]["backends"] == ["tensorboard"]
    assert cfg["model"]["path"] == str(tmp_path / "no-model")  # not checked: nothing is run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # no output_dir, no run dir


@pytest.mark.parametrize("command", ["validate", "run"])
def test_deeply_nested_yaml_exits_2_with_one_line(tmp_path: Path, command: str) -> None:
    """About 2 KB nested 1000 deep: the nesting bound's one line, not a RecursionError."""
    path = _write(tmp_path, "[" * 1000 + "]" * 1000)
    line = one_error_line(run_cli(command, str(path)))
    assert line == (
        f"error: {path}: invalid YAML: line 1, column 65: nested deeper than 64 levels "
        "(the bound on a config's nesting)"
    )


def test_validate_checks_the_paths_the_config_names(tmp_path: Path) -> None:
    data = _config(tmp_path, tmp_path / "no-model")
    data["domains"][1]["prompts"] = {"kind": "jsonl", "train_path": str(tmp_path / "t.jsonl"),
                                     "eval_path": str(tmp_path / "e.jsonl")}  # fmt: skip
    path = _write(tmp_path, data, "c.yaml")
    proc = run_cli("validate", str(path))
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {path}: model.path: {tmp_path / 'no-model'} does not exist "
        "(build the tiny one with `cascade model init`)",
        f"error: {path}: domains.1.prompts.train_path: {tmp_path / 't.jsonl'} does not exist",
        f"error: {path}: domains.1.prompts.eval_path: {tmp_path / 'e.jsonl'} does not exist",
    ]
    proc = run_cli("validate", "--schema-only", str(path))
    assert proc.returncode == 0 and proc.stdout.startswith(f"ok: {path}")
    (tmp_path / "no-model").mkdir()
    (tmp_path / "t.jsonl").write_text("")
    (tmp_path / "e.jsonl").write_text("")
    line = one_error_line(run_cli("validate", str(path)))
    assert line == (
        f"error: {path}: model.path: {tmp_path / 'no-model'} is not a model directory (no config.json) "
        "(build the tiny one with `cascade model init`)"
    )
    (tmp_path / "no-model" / "config.json").write_text("{}")
    proc = run_cli("validate", str(path))
    assert (proc.returncode, proc.stderr) == (0, "")


def test_run_without_model_dir_exits_2(tmp_path: Path) -> None:
    path = _write(tmp_path, _config(tmp_path, tmp_path / "no-model"), "c.yaml")
    line = one_error_line(run_cli("run", str(path)))
    assert "model.path" in line and "cascade model init" in line
    assert not (tmp_path / "out").exists()


def test_run_on_existing_run_dir_exits_2(tmp_path: Path, random_tiny_model: Path) -> None:
    path = _write(tmp_path, _config(tmp_path, random_tiny_model), "c.yaml")
    run_dir = tmp_path / "out" / "cli-test"
    run_dir.mkdir(parents=True)
    (run_dir / "keep.txt").write_text("an earlier run")
    line = one_error_line(run_cli("run", str(path), "--no-progress"))
    assert "--resume" in line and "--fresh" in line
    assert sorted(p.name for p in run_dir.iterdir()) == ["keep.txt"]


def test_fresh_on_a_run_with_history_needs_yes_without_a_terminal(
    tmp_path: Path, random_tiny_model: Path
) -> None:
    path = _write(tmp_path, _config(tmp_path, random_tiny_model), "c.yaml")
    run_dir = tmp_path / "out" / "cli-test"
    run_dir.mkdir(parents=True)
    (run_dir / "keep.txt").write_text("an earlier run")
    line = one_error_line(run_cli("run", str(path), "--fresh", "--no-progress"))
    assert "--yes" in line and str(run_dir) in line
    assert sorted(p.name for p in run_dir.iterdir()) == ["keep.txt"]
    line = one_error_line(run_cli("run", str(path), "--fresh", "--resume", "--no-progress"))
    assert "exclude" in line


def test_fresh_asks_in_a_terminal(tmp_path: Path) -> None:
    from cascade.runner.fresh import confirm_fresh

    run_dir = tmp_path / "run"
    assert confirm_fresh(run_dir, yes=False, interactive=False) is None  # nothing to lose
    run_dir.mkdir()
    (run_dir / "cascade.db").write_text("")
    asked: list[str] = []
    assert confirm_fresh(run_dir, yes=False, interactive=True, ask=lambda q: asked.append(q) or "yes") is None
    assert "moves the run" in asked[0] and "aside" in asked[0]
    assert (
        confirm_fresh(run_dir, yes=False, interactive=True, ask=lambda q: "n")
        == "not confirmed: nothing moved"
    )
    assert "--yes" in (confirm_fresh(run_dir, yes=False, interactive=False) or "")
    assert confirm_fresh(run_dir, yes=True, interactive=False) is None


def test_report_without_report_exits_2(tmp_path: Path) -> None:
    line = one_error_line(run_cli("report", str(tmp_path)))
    assert "no report yet" in line


@pytest.mark.parametrize(
    "args", [["--help"], ["run", "--help"], ["validate", "--help"], ["export", "--help"]]
)
def test_help(args: list[str]) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")
    assert proc.stderr == ""


def test_help_lists_commands() -> None:
    out = run_cli("--help").stdout
    for command in ("run", "validate", "model", "report", "export"):
        assert command in out
    assert "--resume" in run_cli("run", "--help").stdout


def test_no_command_is_a_usage_error() -> None:
    proc = run_cli()
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_flags_are_shared_by_run_up_and_the_learner(tmp_path: Path, capsys) -> None:
    """`cascade run`, `cascade up` and `cascade-learner` take the same start flags; the learner
    refuses `--resume --fresh` while parsing (the other two refuse it in the command)."""
    from cascade.cli.main import build_parser
    from services.learner.main import parse_args

    config = tmp_path / "c.yaml"
    config.write_text("name: x\n")
    for argv in (["run", "c.yaml"], ["up", "c.yaml"]):
        args = build_parser().parse_args([*argv, "--fresh", "--yes", "--cascade-id", "3"])
        assert (args.fresh, args.yes, args.resume, args.cascade_id) == (True, True, False, 3)
    args = parse_args(
        [str(config), "--rollout", "127.0.0.1:1", "--resume", "--db", "sqlite://", "--cascade-id", "3"]
    )
    assert (args.resume, args.fresh, args.cascade_id) == (True, False, 3)
    with pytest.raises(SystemExit) as exit_:
        parse_args([str(config), "--rollout", "127.0.0.1:1", "--resume", "--fresh"])
    assert exit_.value.code == 2
    assert "not allowed with argument --resume" in capsys.readouterr().err

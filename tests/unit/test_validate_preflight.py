"""Errors caught before a run starts: `cascade validate` (and `cascade run` / `cascade up`, through
the same `preflight_problems`, before any model is loaded or process started) refuses in one line
naming the field: (a) token budgets over the model's context, (b) a model without a chat template
(`chat.template_path` / `chat.template` give one), (c) an `output_dir` that cannot be created or
written, and a run that stopped before its first checkpoint is never told to `--resume`;
(d) relative paths in a config file are taken from the file's directory."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from cli_process import one_error_line, run_cli

from cascade.config import ChatConfig, ConfigError, load_cascade_config, preflight_problems

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _model(tmp_path: Path, *, context: int | None = 256, template: bool = True) -> Path:
    """A model directory as the checks read it: config.json and tokenizer_config.json (no weights:
    a check that loaded the model would fail on them)."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    config: dict[str, Any] = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2}
    config |= {"vocab_size": 300, "intermediate_size": 128, "num_attention_heads": 4}
    if context is not None:
        config["max_position_embeddings"] = context
    (model / "config.json").write_text(json.dumps(config))
    tok: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if template:
        tok["chat_template"] = TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(tok))
    return model


def _data(tmp_path: Path, model: Path, **grpo: Any) -> dict[str, Any]:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 8, "n_eval": 4}
    return {
        "name": "preflight",
        "model": {"path": str(model)},
        "domains": [{"name": "math", "prompts": prompts}, {"name": "if", "prompts": prompts}],
        "stages": [
            {"domain": "math", "grpo": {"group_size": 2, "prompts_per_step": 2, **grpo}},
            {"domain": "if", "grpo": {"group_size": 2, "prompts_per_step": 2}},
        ],
        "output_dir": str(tmp_path / "runs"),
        "learner": {"memory_gib": 64},
    }


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- (a) the context


def test_a_budget_over_the_models_context_is_one_line_naming_the_field(tmp_path: Path) -> None:
    model = _model(tmp_path, context=256)
    data = _data(tmp_path, model, budget={"max_new_tokens": 200})
    data["domains"][0]["max_prompt_tokens"] = 64
    path = _write(tmp_path / "c.yaml", data)
    line = one_error_line(run_cli("validate", str(path)))
    assert line == (
        f"error: {path}: stages.0.grpo.budget.max_new_tokens: 200 + prompt 64 exceeds the model's "
        f"context 256 ({model / 'config.json'} max_position_embeddings; the prompt from "
        "domains.0.max_prompt_tokens): lower it, or use a model with a longer context"
    )
    # the same check in `cascade run`, before any model is loaded (this one has no weights) or written
    assert one_error_line(run_cli("run", str(path), "--no-progress")) == line
    assert not (tmp_path / "runs").exists()


def test_the_context_check_names_grow_to_and_the_eval_budget(tmp_path: Path) -> None:
    model = _model(tmp_path, context=256)
    data = _data(tmp_path, model, budget={"max_new_tokens": 64, "grow_to": [128, 240], "grow_every": 5})
    data["stages"][1]["eval"] = {"max_new_tokens": 300}
    problems = preflight_problems(load_cascade_config(_write(tmp_path / "c.yaml", data)))
    assert [p.split(":")[0] for p in problems] == [
        "stages.0.grpo.budget.grow_to.1",
        "stages.1.eval.max_new_tokens",
    ]
    assert "240 + prompt 32 exceeds the model's context 256" in problems[0]
    assert "set domains.N.max_prompt_tokens" in problems[0]  # the prompt was assumed
    data["stages"][0]["grpo"]["budget"]["grow_to"] = [128, 224]
    data["stages"][1]["eval"] = {"max_new_tokens": 224}
    assert preflight_problems(load_cascade_config(_write(tmp_path / "c.yaml", data))) == []


def test_a_model_without_max_position_embeddings_is_not_checked(tmp_path: Path) -> None:
    model = _model(tmp_path, context=None)
    data = _data(tmp_path, model, budget={"max_new_tokens": 100_000})
    assert preflight_problems(load_cascade_config(_write(tmp_path / "c.yaml", data))) == []


def test_up_refuses_a_budget_over_the_context_before_any_process_starts(
    tmp_path: Path, popen_calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.cli.main import main

    model = _model(tmp_path, context=128)
    path = _write(tmp_path / "c.yaml", _data(tmp_path, model, budget={"max_new_tokens": 100}))
    assert main(["up", str(path), "--log-dir", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {path}: stages.0.grpo.budget.max_new_tokens: 100 + prompt 32 exceeds the model's "
        f"context 128 ({model / 'config.json'} max_position_embeddings; a prompt assumed: set "
        "domains.N.max_prompt_tokens): lower it, or use a model with a longer context"
    ]
    assert popen_calls == [] and not (tmp_path / "logs").exists() and not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- (b) the chat template


def test_a_model_without_a_chat_template_is_refused_and_the_config_can_give_one(tmp_path: Path) -> None:
    model = _model(tmp_path, template=False)
    data = _data(tmp_path, model)
    path = _write(tmp_path / "c.yaml", data)
    line = one_error_line(run_cli("validate", str(path)))
    assert line.startswith(f"error: {path}: model.path: {model}'s tokenizer has no chat template")
    assert "chat.template_path" in line
    (tmp_path / "chat.jinja").write_text(TEMPLATE)
    data["chat"] = {"template_path": "chat.jinja"}  # relative: next to the config file
    proc = run_cli("validate", str(_write(tmp_path / "c.yaml", data)))
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    data["chat"] = {"template": TEMPLATE}
    assert preflight_problems(load_cascade_config(_write(tmp_path / "c.yaml", data))) == []


def test_a_chat_template_file_must_exist_and_parse(tmp_path: Path) -> None:
    data = _data(tmp_path, _model(tmp_path, template=False))
    data["chat"] = {"template_path": "missing.jinja"}
    [problem] = preflight_problems(load_cascade_config(_write(tmp_path / "c.yaml", data)))
    assert problem == f"chat.template_path: {tmp_path / 'missing.jinja'} does not exist"
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m.content }}")
    data["chat"] = {"template_path": "bad.jinja"}
    [problem] = preflight_problems(load_cascade_config(_write(tmp_path / "c.yaml", data)))
    assert problem.startswith("chat.template_path: not a Jinja template: line 1: ")
    data["chat"] = {"template_path": "bad.jinja", "template": TEMPLATE}
    with pytest.raises(ConfigError, match="chat: Value error, set template_path or template, not both"):
        load_cascade_config(_write(tmp_path / "c.yaml", data))


def test_prompts_render_through_the_configs_template(random_tiny_model: Path, tmp_path: Path) -> None:
    """A tokenizer without a template loads; every prompt goes through the config's template, and
    without either the render names the fields that give one."""
    from cascade.model.chat import NoChatTemplate, encode_prompts, render_messages, render_prompt
    from cascade.model.loading import load_tokenizer

    bare = tmp_path / "bare"
    shutil.copytree(random_tiny_model, bare, ignore=shutil.ignore_patterns("*.safetensors", "chat_template*"))
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(bare)
    assert not tokenizer.chat_template
    chat = ChatConfig(template=TEMPLATE, system_prompt="be brief")
    assert render_prompt(tokenizer, chat, "2+2?", thinking=False) == (
        "<|system|>be brief\n<|user|>2+2? /no_think\n<|assistant|>"
    )
    messages = [{"role": "user", "content": "hi"}]
    assert render_messages(tokenizer, chat, messages, thinking=True).startswith("<|system|>be brief\n")
    assert encode_prompts(tokenizer, chat, ["2+2?"], thinking=False)[0]
    with pytest.raises(NoChatTemplate, match="chat.template_path"):
        render_prompt(tokenizer, ChatConfig(), "2+2?", thinking=False)


# --------------------------------------------------------------------------- (c) the output directory


def test_an_output_dir_that_cannot_be_created_is_refused_before_anything_loads(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    data = _data(tmp_path, _model(tmp_path))
    data["output_dir"] = str(tmp_path / "a-file" / "runs")
    path = _write(tmp_path / "c.yaml", data)
    line = one_error_line(run_cli("validate", str(path)))
    assert line == (
        f"error: {path}: output_dir: {tmp_path / 'a-file' / 'runs'} cannot be created: "
        f"{tmp_path / 'a-file'} is not a directory"
    )
    assert one_error_line(run_cli("run", str(path), "--no-progress")) == line
    # a --run-dir given on the command line is what the run writes: checked in its place
    line = one_error_line(run_cli("run", str(path), "--run-dir", str(tmp_path / "a-file" / "r")))
    assert line.endswith(
        f"--run-dir: {tmp_path / 'a-file' / 'r'} cannot be created: {tmp_path / 'a-file'} is not a directory"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any directory")
def test_an_output_dir_without_write_permission_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        data = _data(tmp_path, _model(tmp_path))
        data["output_dir"] = str(locked / "runs")
        [problem] = preflight_problems(load_cascade_config(_write(tmp_path / "c.yaml", data)))
        assert problem == f"output_dir: {locked / 'runs'} cannot be created: {locked} is not writable"
    finally:
        locked.chmod(0o700)


def test_a_run_stopped_before_its_first_checkpoint_is_not_told_to_resume(tmp_path: Path) -> None:
    from cascade.cli.run import restart_hint

    args = SimpleNamespace(config="c.yaml", argv=["run", "c.yaml", "--no-progress"])
    run_dir = tmp_path / "runs" / "preflight"
    hint = restart_hint(args, run_dir, embedded=True, fixed=True)  # nothing written
    assert (
        hint == "nothing was trained; start again once that is fixed with: cascade run c.yaml --no-progress"
    )
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")  # the attempt recorded itself, then stopped
    hint = restart_hint(args, run_dir, embedded=True)
    assert "--resume" not in hint
    assert hint == (
        "nothing to resume (no checkpoint yet); start over with: "
        f"cascade run c.yaml --no-progress --fresh --run-dir {run_dir}"
    )
    from cascade.parallel.checkpoint import STATE_FILE

    step = run_dir / "checkpoints" / "step-000001"
    step.mkdir(parents=True)
    (step / STATE_FILE).write_text("{}")  # a finished checkpoint: now there is something to resume
    assert restart_hint(args, run_dir, embedded=True) == (
        f"continue with: cascade run c.yaml --resume --run-dir {run_dir}"
    )


# --------------------------------------------------------------------------- (d) relative paths


def test_relative_paths_are_taken_from_the_config_files_directory(tmp_path: Path) -> None:
    model = _model(tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("train", "eval"):
        (tmp_path / "data" / f"{name}.jsonl").write_text("")
    data = _data(tmp_path, model)
    data["model"]["path"] = "../model"
    data["domains"][0]["prompts"] = {"kind": "jsonl", "train_path": "../data/train.jsonl",
                                     "eval_path": "../data/eval.jsonl"}  # fmt: skip
    del data["output_dir"]  # the default, `runs`, is a relative path in the file too
    path = _write(tmp_path / "configs" / "c.yaml", data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cfg = load_cascade_config(path)
    assert cfg.model.path == model
    assert cfg.domains[0].prompts.train_path == tmp_path / "data" / "train.jsonl"  # type: ignore[union-attr]
    assert cfg.output_dir == tmp_path / "configs" / "runs"
    proc = run_cli("validate", str(path), cwd=elsewhere)  # from any working directory, the same files
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    proc = run_cli("validate", os.path.relpath(path, elsewhere), cwd=elsewhere)  # a CLI path: from the cwd
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr


def test_the_examples_name_the_repositorys_models_from_any_directory(tmp_path: Path) -> None:
    cfg = load_cascade_config(os.path.relpath(REPO / "examples" / "tiny-cascade.yaml"))
    assert cfg.model.path == REPO / "models" / "tiny"
    assert cfg.output_dir == REPO / "runs"  # `make demo`'s runs/tiny-cascade, as before
    hf = load_cascade_config(REPO / "examples" / "hf-public-data.yaml")
    assert all(p.is_file() for files in hf.domains[0].prompts.data_files.values() for p in files)  # type: ignore[union-attr]

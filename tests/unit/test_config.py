"""Cascade configs: the examples validate, and every bad config fails with one line that names
the field path and the reason (the CLI prints that line as is)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.config import (
    MAX_DEPTH,
    CascadeConfig,
    ConfigError,
    NestingTooDeep,
    check_json_depth,
    check_paths,
    config_paths,
    load_cascade_config,
    parse_cascade_config,
    parse_cascade_json,
    parse_cascade_yaml,
    resolve_path,
    with_resolved_paths,
)

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def _base() -> dict[str, Any]:
    """A small valid cascade: if -> math -> code, distilling from earlier domains."""
    return {
        "name": "unit",
        "model": {"path": "/nonexistent/model"},
        "domains": [{"name": "if"}, {"name": "math"}, {"name": "code"}],
        "stages": [
            {"domain": "if"},
            {"domain": "math", "distill": {"teachers": ["if"]}},
            {"domain": "code"},
        ],
    }


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_cascade_config(data, "bad.yaml")
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith("bad.yaml: "), message
    return message


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "cascade.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- the examples


def test_examples_exist() -> None:
    assert EXAMPLES, "no examples/*.yaml found"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_validates(path: Path) -> None:
    cfg = load_cascade_config(path)
    assert isinstance(cfg, CascadeConfig)
    assert cfg.stages and cfg.domains
    trained = {d.name for d in cfg.domains}
    assert all(s.domain in trained for s in cfg.stages)


def test_base_config_is_valid() -> None:
    cfg = parse_cascade_config(_base())
    assert [s.label for s in cfg.stages] == ["if", "math", "code"]


def test_load_valid_file(tmp_path: Path) -> None:
    cfg = load_cascade_config(_write(tmp_path, _base()))
    assert cfg.name == "unit"
    assert cfg.model.path == Path("/nonexistent/model")


# --------------------------------------------------------------------------- bad configs


def test_group_size_one() -> None:
    data = _base()
    data["stages"][0]["grpo"] = {"group_size": 1}
    msg = _error(data)
    assert "stages.0.grpo.group_size" in msg
    assert "greater than or equal to 2" in msg
    assert "got 1" in msg


@pytest.mark.parametrize(
    ("where", "typo", "path"),
    [
        (("stages", 1), "grpoo", "stages.1.grpoo"),
        (("stages", 0, "grpo"), "lerning_rate", "stages.0.grpo.lerning_rate"),
        ((), "seeed", "seeed"),
    ],
)
def test_unknown_field(where: tuple, typo: str, path: str) -> None:
    data = _base()
    node: Any = data
    for key in where:
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        else:
            node = node[key]
    node[typo] = 3
    msg = _error(data)
    assert f": {path}: " in msg
    assert "Extra inputs are not permitted" in msg


def test_stage_domain_not_in_domains() -> None:
    data = _base()
    data["domains"] = [{"name": "if"}, {"name": "math"}]
    msg = _error(data)
    assert "stages.2.domain" in msg
    assert "'code'" in msg and "not in domains" in msg


def test_teacher_not_trained_earlier() -> None:
    data = _base()
    data["stages"][1]["distill"] = {"teachers": ["code"]}  # code is stage 2: later, not earlier
    msg = _error(data)
    assert "stages.1.distill.teachers" in msg
    assert "'code'" in msg and "earlier stage" in msg


def test_teacher_cannot_be_the_stage_itself() -> None:
    data = _base()
    data["stages"][0]["distill"] = {"teachers": ["if"]}
    msg = _error(data)
    assert "stages.0.distill.teachers" in msg


def test_reward_kind_mismatch() -> None:
    data = _base()
    data["domains"][1]["reward"] = {"kind": "code"}  # domain math
    msg = _error(data)
    assert "domains.1" in msg
    assert "reward kind 'code'" in msg and "'math'" in msg


@pytest.mark.parametrize("grow_to", [[32, 32], [8], [32, 24]])
def test_grow_to_not_increasing(grow_to: list[int]) -> None:
    data = _base()
    data["stages"][0]["grpo"] = {"budget": {"max_new_tokens": 16, "grow_to": grow_to, "grow_every": 2}}
    msg = _error(data)
    assert "stages.0.grpo.budget" in msg
    assert "grow_to must increase" in msg


def test_grow_to_needs_grow_every() -> None:
    data = _base()
    data["stages"][0]["grpo"] = {"budget": {"max_new_tokens": 16, "grow_to": [32]}}
    msg = _error(data)
    assert "stages.0.grpo.budget" in msg and "grow_every" in msg


def test_missing_model() -> None:
    data = _base()
    del data["model"]
    msg = _error(data)
    assert ": model: " in msg
    assert "Field required" in msg


def test_several_errors_stay_one_line() -> None:
    data = _base()
    data["stages"][0]["grpo"] = {"group_size": 1, "top_p": 2.0, "temperature": -1}
    msg = _error(data)
    assert "(+2 more)" in msg


def test_top_level_list(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- name: a\n- name: b\n")
    with pytest.raises(ConfigError) as info:
        load_cascade_config(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    assert "expected a mapping" in msg and "list" in msg


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError) as info:
        load_cascade_config(path)
    assert "expected a mapping" in str(info.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("name: t\nmodel: {path: /x\n", "line 3, column 1"),
        ("name: t\nseed: 0\nmodel: a: b\n", "line 3, column 9"),
    ],
)
def test_bad_yaml_syntax(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_cascade_config(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: invalid YAML: ")
    assert where in msg


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_cascade_config(tmp_path / "nope.yaml")
    msg = str(info.value)
    assert "\n" not in msg and "cannot read" in msg


def test_not_utf8(tmp_path: Path) -> None:
    """A binary or mis-encoded file is a config error too, not a UnicodeDecodeError."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\nmodel: {path: /x}\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_cascade_config(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path))


def test_relative_model_path_resolves_next_to_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cfg" / "models" / "tiny").mkdir(parents=True)
    data = _base()
    data["model"] = {"path": "models/tiny"}
    path = tmp_path / "cfg" / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)  # models/tiny does not exist here
    cfg = load_cascade_config(path)
    assert cfg.model.path == tmp_path / "cfg" / "models" / "tiny"


# --------------------------------------------------------------------------- nesting bound

DEEP_YAML = {
    "flow-lists": "[" * 1000 + "]" * 1000,
    "flow-mappings": "{a: " * 1000 + "1" + "}" * 1000,
    "block-sequences": "- " * 1000 + "1\n",
    "block-mappings": "".join(" " * i + "a:\n" for i in range(1000)) + " " * 1000 + "1\n",
    "under-a-key": "name: x\nmodel:\n  path: " + "[" * 1000 + "]" * 1000 + "\n",
}


@pytest.mark.parametrize("case", sorted(DEEP_YAML))
def test_deep_yaml_file_is_one_line_naming_the_bound(tmp_path: Path, case: str) -> None:
    """About 2 KB nested 1000 deep was a RecursionError (a traceback in `cascade validate`)."""
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP_YAML[case])
    with pytest.raises(ConfigError) as info:
        load_cascade_config(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: invalid YAML: line ")
    assert msg.endswith(f"nested deeper than {MAX_DEPTH} levels (the bound on a config's nesting)")


def test_nesting_bound_is_exact_and_configurable() -> None:
    for depth, ok in ((MAX_DEPTH, True), (MAX_DEPTH + 1, False)):
        for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
            if ok:
                check_json_depth(text)
            else:
                with pytest.raises(NestingTooDeep):
                    check_json_depth(text)
        yaml_text = "[" * depth + "]" * depth
        with pytest.raises(ConfigError) as info:  # parses, then is not a mapping
            parse_cascade_yaml(yaml_text, "t")
        assert ("expected a mapping" in str(info.value)) == ok
    with pytest.raises(ConfigError, match="nested deeper than 8 levels"):
        parse_cascade_json("[" * 9 + "]" * 9, "t", max_depth=8)
    with pytest.raises(ConfigError, match="nested deeper than 8 levels"):
        parse_cascade_yaml("[" * 9 + "]" * 9, "t", max_depth=8)


def test_json_depth_skips_strings() -> None:
    check_json_depth(json.dumps({"a": "[" * 500, "b": '{\\"[[[' * 100}))
    check_json_depth('"' + "\\" * 10 + '"' + "[]" * 10)
    check_json_depth('["unterminated ' + "[" * 500)  # left to json.loads, which says where
    with pytest.raises(NestingTooDeep, match="character 71: "):  # 6 string chars, then the 65th [
        check_json_depth('"[[[["' + "[" * 65)
    json_config = json.dumps(_base())
    assert parse_cascade_json(json_config, "t") == parse_cascade_config(_base(), "t")


def test_a_long_flat_config_stays_fast() -> None:
    """The bound is checked while parsing: a 1000-stage config (120 KB) is not slowed by it."""
    import time

    data = _base()
    data["stages"] = [{"name": f"s{i}", "domain": "if"} for i in range(1000)]
    text = yaml.safe_dump(data)
    start = time.perf_counter()
    cfg = parse_cascade_yaml(text, "t")
    assert len(cfg.stages) == 1000
    assert time.perf_counter() - start < 30  # generous: a loaded 2-core machine


# --------------------------------------------------------------------------- paths named


def _model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_check_paths_all_present(tmp_path: Path) -> None:
    data = _base()
    data["model"] = {"path": str(_model_dir(tmp_path / "model"))}
    (tmp_path / "train.jsonl").write_text("")
    (tmp_path / "eval.jsonl").write_text("")
    train, evals = str(tmp_path / "train.jsonl"), str(tmp_path / "eval.jsonl")
    data["domains"][1]["prompts"] = {"kind": "jsonl", "train_path": train, "eval_path": evals}
    data["domains"].append(
        {"name": "rlhf", "reward": {"kind": "rlhf", "model_path": str(_model_dir(tmp_path / "rm"))}}
    )
    data["output_dir"] = str(tmp_path / "runs")  # need not exist yet
    assert check_paths(parse_cascade_config(data)) == []


def test_check_paths_names_each_missing_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "a-dir.jsonl").mkdir()
    (tmp_path / "runs-file").write_text("")
    data = _base()
    data["model"] = {"path": "not-a-model"}
    data["domains"][1]["prompts"] = {"kind": "jsonl", "train_path": "nope.jsonl", "eval_path": "a-dir.jsonl"}
    data["domains"].append({"name": "rlhf", "reward": {"kind": "rlhf", "model_path": "/nonexistent/rm"}})
    data["output_dir"] = "runs-file"
    assert check_paths(parse_cascade_config(data)) == [
        f"model.path: not-a-model ({tmp_path}/not-a-model) is not a model directory (no config.json) "
        "(build the tiny one with `cascade model init`)",
        f"domains.1.prompts.train_path: nope.jsonl ({tmp_path}/nope.jsonl) does not exist",
        f"domains.1.prompts.eval_path: a-dir.jsonl ({tmp_path}/a-dir.jsonl) is not a file",
        "domains.3.reward.model_path: /nonexistent/rm does not exist",
        f"output_dir: runs-file ({tmp_path}/runs-file) exists and is not a directory",
    ]


@pytest.mark.parametrize("name", ["..", "."])
def test_a_name_that_is_a_directory_is_refused(tmp_path: Path, name: str) -> None:
    """The run directory is `<output_dir>/<name>`: `..` would be output_dir's parent (another
    run's directory, when output_dir is inside one), `.` output_dir itself. Refused by the model,
    so `cascade run`, `cascade validate` and the API all name the field."""
    data = _base()
    data["name"] = name
    assert _error(data).startswith(f"bad.yaml: name: Value error, {name!r} names a directory")
    with pytest.raises(ConfigError, match=r"cascade\.yaml: name: .*names a directory"):
        load_cascade_config(_write(tmp_path, data))
    for fine in ("...", "a..b", ".hidden", "run.1"):
        assert parse_cascade_config({**_base(), "name": fine}).name == fine


def test_config_paths_lists_every_path_with_its_kind() -> None:
    data = _base()
    data["domains"][1]["prompts"] = {"kind": "jsonl", "train_path": "t.jsonl", "eval_path": "e.jsonl"}
    data["domains"].append({"name": "rlhf", "reward": {"kind": "rlhf", "model_path": "rm"}})
    data["domains"].append(
        {"name": "swe", "prompts": {"kind": "hf", "adapter": "swe", "data_files": {"train": ["a.parquet"]}}}
    )
    data["tracking"] = {"tensorboard": {"log_dir": "tb"}, "mlflow": {"tracking_uri": "sqlite:///ml.db"}}
    found = {(p.field, str(p.path), p.kind) for p in config_paths(parse_cascade_config(data))}
    assert found == {
        ("model.path", "/nonexistent/model", "model"),
        ("domains.1.prompts.train_path", "t.jsonl", "data"),
        ("domains.1.prompts.eval_path", "e.jsonl", "data"),
        ("domains.3.reward.model_path", "rm", "model"),
        ("domains.4.prompts.data_files.train.0", "a.parquet", "data"),
        ("tracking.tensorboard.log_dir", "tb", "output"),
        ("tracking.mlflow.tracking_uri", "ml.db", "output"),
        ("output_dir", "runs", "output"),
    }
    for uri in ("http://mlflow:5000", "databricks", "postgresql://u@db/mlflow"):
        data["tracking"] = {"mlflow": {"tracking_uri": uri}}
        assert "tracking.mlflow.tracking_uri" not in {
            p.field for p in config_paths(parse_cascade_config(data))
        }


def test_with_resolved_paths(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    data = _base()
    data["model"] = {"path": "link/../real/./model"}
    data["output_dir"] = "link/runs"
    data["tracking"] = {"mlflow": {"tracking_uri": "sqlite:///link/ml.db"}}
    cfg = with_resolved_paths(parse_cascade_config(data), tmp_path)
    assert cfg.model.path == tmp_path / "real" / "model"
    assert cfg.output_dir == tmp_path / "real" / "runs"  # the symlink followed
    assert cfg.tracking.mlflow.tracking_uri == f"sqlite:///{tmp_path / 'real' / 'ml.db'}"
    assert resolve_path("/etc/../etc/./passwd", tmp_path) == Path("/etc/passwd")
    with pytest.raises(ValueError, match="model.path: not a usable path"):
        with_resolved_paths(parse_cascade_config({**_base(), "model": {"path": "a\0b"}}), tmp_path)


def test_training_diff_compares_paths_resolved(tmp_path: Path) -> None:
    from cascade.config.diff import training_diff

    stored = with_resolved_paths(parse_cascade_config(_base()), tmp_path).model_dump(mode="json")
    given = {**_base(), "model": {"path": "/nonexistent/../nonexistent/model"}}
    assert training_diff(stored, parse_cascade_config(given).model_dump(mode="json"), tmp_path) == []
    given["model"] = {"path": "models/../../other"}
    diff = training_diff(stored, parse_cascade_config(given).model_dump(mode="json"), tmp_path)
    assert diff == [
        'model.path: cascade has "/nonexistent/model", the config has "models/../../other" '
        f"(resolves to {tmp_path.parent / 'other'})"
    ]


# --------------------------------------------------------------------------- teachers_for


def test_teachers_for_earlier_domains_only() -> None:
    data = _base()
    data["stages"][1]["distill"] = {}  # "earlier"
    data["stages"].append({"name": "math-again", "domain": "math"})
    cfg = parse_cascade_config(data)
    assert cfg.teachers_for(0) == []
    assert cfg.teachers_for(1) == ["if"]
    assert cfg.teachers_for(2) == ["if", "math"]
    # A stage never distils from its own domain, even if it was trained earlier.
    assert cfg.teachers_for(3) == ["if", "code"]


def test_teachers_for_explicit_list() -> None:
    data = _base()
    data["stages"][2]["distill"] = {"teachers": ["math"]}
    cfg = parse_cascade_config(data)
    assert cfg.teachers_for(1) == ["if"]
    assert cfg.teachers_for(2) == ["math"]


def test_teachers_for_distill_disabled() -> None:
    data = _base()
    data["stages"][1]["distill"] = {"enabled": False, "teachers": ["if"]}
    data["stages"][2]["distill"] = {"enabled": False}
    cfg = parse_cascade_config(data)
    assert cfg.teachers_for(1) == []
    assert cfg.teachers_for(2) == []


def test_config_is_frozen() -> None:
    cfg = parse_cascade_config(copy.deepcopy(_base()))
    with pytest.raises(ValueError):
        cfg.seed = 3  # type: ignore[misc]


def test_parse_domain_config_alone() -> None:
    from cascade.config import CodeReward, parse_domain_config

    cfg = parse_domain_config({"name": "code", "reward": {"kind": "code", "mode": "pass_fraction"}})
    assert isinstance(cfg.reward, CodeReward) and cfg.reward.mode == "pass_fraction"
    with pytest.raises(ConfigError, match=r"^request: reward\.code\.time_limit_s: .*greater than 0"):
        parse_domain_config({"name": "code", "reward": {"kind": "code", "time_limit_s": 0}}, "request")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_domain_config(["code"])

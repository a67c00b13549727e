"""Cascade configs: the examples validate, and every bad config fails with one line that names
the field path and the reason (the CLI prints that line as is)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.config import CascadeConfig, ConfigError, load_cascade_config, parse_cascade_config

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

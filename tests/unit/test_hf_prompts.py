"""`kind: hf` prompt sources: each format adapter on its fixture (tests/data/hf, parquet and JSON
lines, written by tests/data/hf/make_fixtures.py), splits / seed / filters / dedup / held-out
eval, the IFEval mapping onto our rules, the config errors, and `cascade data inspect`."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from cascade.cli.main import main as cli_main
from cascade.config import (
    ConfigError,
    check_paths,
    load_cascade_config,
    parse_cascade_config,
    parse_domain_config,
)
from cascade.config.hf import HfPrompts
from cascade.domains import load_problems
from cascade.domains.hf_adapters import Unconvertible, assert_to_test, last_boxed
from cascade.domains.hf_ifeval import UnusableRow, rules_for
from cascade.domains.hf_source import HfSourceError, load_hf
from cascade.domains.if_rules import rule_from_json

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "hf"
FORMATS = ("parquet", "jsonl")


def _source(adapter: str, files: dict[str, str], ext: str, **kw: Any) -> HfPrompts:
    data_files = {split: [DATA / f"{name}.{ext}"] for split, name in files.items()}
    return HfPrompts(adapter=adapter, data_files=data_files, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- adapters


@pytest.mark.parametrize("ext", FORMATS)
def test_gsm8k(ext: str) -> None:
    src = _source("gsm8k", {"train": "gsm8k/train", "test": "gsm8k/test"}, ext, eval_split="test", n_eval=5)
    got = load_hf(src, "math")
    train = {p.prompt.split(".")[0]: p for p in got.train}
    assert train["Natalia sold clips to 48 friends in April, and half as many in May"].answer == "\\boxed{72}"
    assert train["A shop sells 250 pens a day"].answer == "\\boxed{1000}"  # `#### 1,000`
    assert all(p.domain == "math" and p.meta["solution"] for p in got.train)
    report = got.reports["train"]
    assert (report.rows, report.unconvertible, report.duplicates, report.kept) == (6, 1, 1, 4)
    assert "####" in report.reasons[0]
    assert sorted(p.answer for p in got.eval) == ["\\boxed{13}", "\\boxed{3}"]


@pytest.mark.parametrize("ext", FORMATS)
def test_math_level_filter(ext: str) -> None:
    src = _source("math", {"train": "math/train"}, ext, n_eval=1, filters={"level": ["Level 1", "Level 2"]})
    got = load_hf(src, "math")
    problems = got.train + got.eval
    assert {p.meta["level"] for p in problems} <= {"Level 1", "Level 2"}
    assert sorted(p.answer for p in problems) == ["\\boxed{2}", "\\boxed{3}", "\\boxed{\\frac{1}{2}}"]
    assert got.reports["train"].filtered_out == 2  # Level 3 and the unboxed Level 5
    assert {p.meta["type"] for p in problems} == {"Algebra", "Prealgebra"}


def test_last_boxed_matches_braces() -> None:
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("no box") is None


@pytest.mark.parametrize("ext", FORMATS)
def test_mbpp_asserts_become_sandbox_tests(ext: str) -> None:
    got = load_hf(_source("mbpp", {"train": "mbpp/train"}, ext, n_eval=1), "code")
    by_id = {p.id: p for p in got.train + got.eval}
    assert set(by_id) == {"mbpp-2", "mbpp-3", "mbpp-5"}
    assert by_id["mbpp-2"].meta == {
        "tests": [
            {"args": [[3, 4, 5, 6], [5, 7, 4, 10]], "output": [4, 5]},
            {"args": [[1, 2, 3, 4], [5, 4, 3, 7]], "output": [3, 4]},
        ],
        "entry_point": "similar_elements",
        "source_split": "train",
        "source_row": 0,
    }
    assert "assert similar_elements" in by_id["mbpp-2"].prompt
    assert by_id["mbpp-5"].answer.startswith("def add(a, b):")
    report = got.reports["train"]
    assert report.unconvertible == 1 and "math.isclose" in report.reasons[0]


@pytest.mark.parametrize("ext", FORMATS)
def test_humaneval_check_becomes_tests(ext: str) -> None:
    got = load_hf(_source("humaneval", {"test": "humaneval/test"}, ext, train_split="test", n_eval=1), "code")
    by_id = {p.id: p for p in got.train + got.eval}
    assert set(by_id) == {"HumanEval/0", "HumanEval/1"}  # HumanEval/2 compares with abs(...) < eps
    assert by_id["HumanEval/0"].meta["tests"] == [
        {"args": [2, 3], "output": 5},
        {"args": [0, 0], "output": 0},
    ]
    assert by_id["HumanEval/0"].meta["entry_point"] == "add"
    assert by_id["HumanEval/1"].answer.endswith("    return s.split()\n")
    assert got.reports["train"].unconvertible == 1


def test_assert_forms() -> None:
    def one(line: str, callee: str | None = None) -> tuple[str, dict[str, Any]]:
        return assert_to_test(ast.parse(line).body[0], callee)

    assert one("assert f(1, 'a', [2]) == {'k': (1, 2)}") == (
        "f",
        {"args": [1, "a", [2]], "output": {"k": [1, 2]}},
    )
    for bad in (
        "assert f(x) == 1",
        "assert f(1) != 2",
        "assert set(f(1)) == {1}",
        "assert f(1) == {1, 2}",
        "assert f(*a) == 1",
        "assert f(k=1) == 1",
        "f(1)",
    ):
        with pytest.raises(Unconvertible):
            one(bad)
    with pytest.raises(Unconvertible, match="not 'candidate'"):
        one("assert g(1) == 1", "candidate")


@pytest.mark.parametrize("ext", FORMATS)
def test_ifeval_rules(ext: str) -> None:
    got = load_hf(_source("ifeval", {"train": "ifeval/train"}, ext, n_eval=1), "if")
    by_id = {p.id: p for p in got.train + got.eval}
    assert by_id["ifeval-1000"].meta["rules"] == [
        {"name": "no_commas", "params": {}},
        {"name": "max_words", "params": {"n": 39}},  # "less than 40"
    ]
    assert by_id["ifeval-1001"].meta["rules"] == [
        {"name": "english_lowercase", "params": {}},  # all lowercase, in English
        {"name": "include_word", "params": {"word": "moon"}},
    ]
    assert by_id["ifeval-1002"].meta["rules"][1] == {
        "name": "end_with_phrase",
        "params": {"phrase": "Is there anything else?"},
    }
    for p in by_id.values():
        assert [rule_from_json(r) for r in p.meta["rules"]]


def test_ifeval_mapping_table() -> None:
    rules = rules_for(
        [
            "keywords:letter_frequency",
            "length_constraints:number_sentences",
            "detectable_format:multiple_sections",
        ],
        [
            {"letter": "z", "let_frequency": 2, "let_relation": "at least", "unused": None},
            {"relation": "less than", "num_sentences": 5},
            {"section_spliter": "Section", "num_sections": 3},
        ],
    )
    assert rules == [
        {"name": "letter_frequency", "params": {"relation": "at least", "n": 2, "letter": "z"}},
        {"name": "sentence_count", "params": {"relation": "at most", "n": 4}},
        {"name": "section_count", "params": {"splitter": "Section", "n": 3}},
    ]
    with pytest.raises(UnusableRow, match="bad kwargs"):
        rules_for(["keywords:existence"], [{"keywords": ["two words"]}])


def test_every_ifeval_id_is_mapped() -> None:
    """The 25 ids of IFEval's registry, the four once unmapped among them."""
    from cascade.domains.hf_ifeval import IFEVAL_RULES

    assert len(IFEVAL_RULES) == 25
    rules = rules_for(
        [
            "language:response_language",
            "length_constraints:nth_paragraph_first_word",
            "detectable_format:number_bullet_lists",
            "combination:repeat_prompt",
        ],
        [
            {"language": "fr"},
            {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "ocean"},
            {"num_bullets": 4},
            {"prompt_to_repeat": "Write a haiku."},
        ],
    )
    assert rules == [
        {"name": "response_language", "params": {"language": "fr"}},
        {
            "name": "paragraph_first_word",
            "params": {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "ocean"},
        },
        {"name": "markdown_bullets", "params": {"n": 4}},
        {"name": "start_with_phrase", "params": {"phrase": "Write a haiku."}},
    ]


@pytest.mark.parametrize("ext", FORMATS)
def test_ifeval_unknown_instruction_is_an_error_naming_it(ext: str) -> None:
    src = _source("ifeval", {"train": "ifeval_unknown/train"}, ext, n_eval=1)
    with pytest.raises(
        HfSourceError, match="unknown IFEval instruction id 'multi-turn:constrained_start'"
    ) as err:
        load_hf(src, "if")
    assert "\n" not in str(err.value) and "prompts.adapter" in str(err.value)
    skip = _source(
        "ifeval",
        {"train": "ifeval/train", "x": "ifeval_unknown/train"},
        ext,
        n_eval=1,
        eval_split="x",
        unknown_instructions="skip",
    )
    with pytest.raises(HfSourceError, match="no eval problems"):
        load_hf(skip, "if")


@pytest.mark.parametrize("ext", FORMATS)
def test_swe(ext: str) -> None:
    got = load_hf(_source("swe", {"train": "swe/train"}, ext, n_eval=1), "swe")
    by_id = {p.id: p for p in got.train + got.eval}
    assert set(by_id) == {"acme__calc-1", "acme__calc-3"}
    p = by_id["acme__calc-1"]
    assert p.answer.startswith("diff --git a/calc.py") and "calc.py:\n```python\ndef total" in p.prompt
    assert p.meta["repo"] == "acme/calc" and p.meta["paths"] == ["calc.py"]
    assert "does not parse" in got.reports["train"].reasons[0]


@pytest.mark.parametrize("ext", FORMATS)
def test_generic_mapping(ext: str) -> None:
    src = _source(
        "generic",
        {"train": "generic/train"},
        ext,
        n_eval=1,
        fields={"prompt": "query", "answer": "final", "id": "uid", "meta": {"difficulty": "difficulty"}},
    )
    got = load_hf(src, "math")
    by_id = {p.id: p for p in got.train + got.eval}
    assert by_id["g1"].prompt == "What is 6 times 7?" and by_id["g1"].answer == "42"
    assert by_id["g2"].meta["difficulty"] == "hard"


def test_load_from_disk(tmp_path: Path) -> None:
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_json(str(DATA / "gsm8k" / "train.jsonl")),
            "test": datasets.Dataset.from_json(str(DATA / "gsm8k" / "test.jsonl")),
        }
    )
    dd.save_to_disk(str(tmp_path / "gsm8k"))
    got = load_hf(HfPrompts(adapter="gsm8k", path=tmp_path / "gsm8k", eval_split="test"), "math")
    assert len(got.train) == 4 and len(got.eval) == 2
    with pytest.raises(HfSourceError, match="no split 'validation'"):
        load_hf(HfPrompts(adapter="gsm8k", path=tmp_path / "gsm8k", eval_split="validation"), "math")


# --------------------------------------------------------------------------- splits, seed, dedup


def test_seed_held_out_eval_and_caps() -> None:
    def ids(seed: int, **kw: Any) -> tuple[list[str], list[str]]:
        got = load_hf(_source("gsm8k", {"train": "gsm8k/train"}, "jsonl", n_eval=2, seed=seed, **kw), "math")
        return [p.id for p in got.train], [p.id for p in got.eval]

    train, held = ids(0)
    assert ids(0) == (train, held)  # deterministic in the seed
    assert len(train) == 2 and len(held) == 2 and not set(train) & set(held)
    assert any(ids(s) != (train, held) for s in range(1, 6))
    assert len(ids(0, n_train=1)[0]) == 1
    no_dedup = load_hf(_source("gsm8k", {"train": "gsm8k/train"}, "jsonl", n_eval=1, dedup=False), "math")
    assert no_dedup.reports["train"].duplicates == 0 and len(no_dedup.train) + len(no_dedup.eval) == 5
    with pytest.raises(HfSourceError, match="n_eval: holding out 5 of the 4"):
        load_hf(_source("gsm8k", {"train": "gsm8k/train"}, "jsonl", n_eval=5), "math")


def test_training_drops_prompts_the_eval_holds() -> None:
    src = _source(
        "gsm8k", {"train": "gsm8k/train", "test": "gsm8k/train"}, "jsonl", eval_split="test", n_eval=2
    )
    got = load_hf(src, "math")
    assert got.reports["train"].overlap == 2 and len(got.train) == 2
    assert not {p.prompt for p in got.train} & {p.prompt for p in got.eval}


# --------------------------------------------------------------------------- config errors


def _domain(name: str, **prompts: Any) -> dict[str, Any]:
    return {"name": name, "prompts": {"kind": "hf", **prompts}}


@pytest.mark.parametrize(
    ("domain", "needle"),
    [
        (
            _domain("math", adapter="gsm9k", data_files={"train": ["x"]}),
            "prompts.hf.adapter: Input should be 'gsm8k'",
        ),
        (
            _domain("code", adapter="gsm8k", data_files={"train": ["x"]}),
            "adapter 'gsm8k' makes math problems, not code",
        ),
        (_domain("math", adapter="generic", data_files={"train": ["x"]}), "adapter 'generic' needs `fields`"),
        (_domain("math", adapter="gsm8k"), "exactly one of `data_files`"),
        (_domain("math", adapter="gsm8k", data_files={"test": ["x"]}), "no 'train' split (train_split)"),
    ],
)
def test_config_errors_are_one_line(domain: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_domain_config(domain)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_missing_column_names_column_and_adapter() -> None:
    src = _source("math", {"train": "gsm8k/train"}, "parquet", n_eval=1)
    with pytest.raises(
        HfSourceError, match=r"prompts.adapter: column 'problem' \(needed by adapter 'math'\)"
    ):
        load_hf(src, "math")
    src = _source("math", {"train": "math/train"}, "parquet", n_eval=1, filters={"difficulty": [1]})
    with pytest.raises(HfSourceError, match="prompts.filters.difficulty: column 'difficulty'"):
        load_hf(src, "math")


# --------------------------------------------------------------------------- end to end


def _cascade(tmp_path: Path) -> dict[str, Any]:
    return {
        "name": "hf",
        "model": {"path": str(ROOT / "models" / "tiny")},
        "output_dir": str(tmp_path),
        "domains": [
            _domain(
                "math",
                adapter="gsm8k",
                eval_split="test",
                n_eval=2,
                data_files={
                    "train": [str(DATA / "gsm8k" / "train.parquet")],
                    "test": [str(DATA / "gsm8k" / "test.parquet")],
                },
            )
        ],
        "stages": [{"domain": "math"}],
    }


def test_cascade_with_hf_source_scores_gsm8k_gold(tmp_path: Path) -> None:
    from cascade.domains.math import MathDomain

    data = _cascade(tmp_path)
    cfg = parse_cascade_config(data)
    assert not [p for p in check_paths(cfg) if "prompts" in p]
    train = load_problems(cfg.domains[0], "train")
    natalia = next(p for p in train if "Natalia" in p.prompt)
    domain = MathDomain()
    try:
        right, wrong = domain.score_batch([natalia, natalia], ["So \\boxed{72}.", "So \\boxed{71}."])
    finally:
        domain.close()
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert len(load_problems(cfg.domains[0], "eval")) == 2
    data["domains"][0]["prompts"]["data_files"]["train"] = [str(tmp_path / "missing.parquet")]
    assert any("prompts.data_files.train.0" in p for p in check_paths(parse_cascade_config(data)))


def test_example_config_validates() -> None:
    cfg = load_cascade_config(ROOT / "examples" / "hf-public-data.yaml")
    assert {d.prompts.kind for d in cfg.domains} == {"hf"}


def test_data_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_cascade(tmp_path)))
    assert cli_main(["data", "inspect", str(path), "--domain", "math", "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert "== domain math (prompts: hf, adapter gsm8k)" in out
    assert "unconvertible (train): row 5: answer has no '#### <n>' line" in out
    train_line = next(line for line in out.splitlines() if line.startswith("train "))
    assert train_line.split()[2:] == ["6", "0", "1", "1", "0", "0", "0", "4"]
    assert out.count("verdict on gold: 1 ok") == 2
    assert out.count("\n-- ") == 2 and "gold: \\boxed{" in out
    assert cli_main(["data", "inspect", str(path), "--domain", "code"]) == 2

"""make_domain / load_problems / write_jsonl."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.config import CodeReward, DomainConfig, IfReward, JsonlPrompts, MathReward, SyntheticPrompts
from cascade.domains import load_problems, make_domain, write_jsonl
from cascade.domains.base import OK
from cascade.domains.code import CodeDomain
from cascade.domains.instruct import IfDomain
from cascade.domains.length_bound import LengthBounded
from cascade.domains.math import MathDomain


def _verifier(domain: object, max_chars: int) -> object:
    """The domain behind `make_domain`'s response-length bound."""
    assert isinstance(domain, LengthBounded) and domain.max_chars == max_chars
    return domain.inner


def test_make_domain_uses_defaults_or_the_given_reward() -> None:
    math = _verifier(make_domain(DomainConfig(name="math")), MathReward().max_response_chars)
    assert isinstance(math, MathDomain) and math.name == "math" and math.config == MathReward()
    reward = CodeReward(mode="pass_fraction", time_limit_s=1, max_response_chars=100)
    code = _verifier(make_domain(DomainConfig(name="code", reward=reward)), 100)
    assert isinstance(code, CodeDomain) and code.config.mode == "pass_fraction"
    assert code.limits.time_limit_s == 1
    instruct = _verifier(make_domain(DomainConfig(name="if", reward=IfReward(mode="fraction"))), 32_000)
    assert isinstance(instruct, IfDomain) and instruct.name == "if" and instruct.config.mode == "fraction"


@pytest.mark.parametrize("name", ["math", "code", "if", "swe"])
def test_load_synthetic_problems(name: str) -> None:
    config = DomainConfig(name=name, prompts=SyntheticPrompts(seed=2, n_train=50, n_eval=20))
    train, evals, sft = (load_problems(config, s) for s in ("train", "eval", "sft"))
    assert (len(train), len(evals), len(sft)) == (50, 20, 50)
    assert train == load_problems(config, "train")
    assert {p.domain for p in train + evals + sft} == {name}
    assert not {p.prompt for p in train} & ({p.prompt for p in evals} | {p.prompt for p in sft})
    with pytest.raises(ValueError, match="unknown split"):
        load_problems(config, "test")


def test_jsonl_round_trip_and_scoring(tmp_path: Path) -> None:
    domain = make_domain(DomainConfig(name="if"))
    train, evals = domain.make_problems("train", 30, 0), domain.make_problems("eval", 10, 0)
    write_jsonl(train, tmp_path / "data" / "train.jsonl")
    write_jsonl(evals, tmp_path / "data" / "eval.jsonl")
    source = JsonlPrompts(train_path=tmp_path / "data/train.jsonl", eval_path=tmp_path / "data/eval.jsonl")
    config = DomainConfig(name="if", prompts=source)
    assert load_problems(config, "train") == train
    assert load_problems(config, "eval") == evals
    loaded = load_problems(config, "eval")
    assert {v.reason for v in domain.score_batch(loaded, [p.answer for p in loaded])} == {OK}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: "),
        ('["a list"]', "line 2: expected a JSON object"),
        ('{"id": "b", "prompt": "p"}', "line 2: field 'answer' must be a string"),
        ('{"id": "b", "prompt": "p", "answer": "a", "meta": []}', "line 2: field 'meta' must be an object"),
        ('{"id": "b", "prompt": "p", "answer": "a", "extra": 1}', "line 2: unknown field"),
        ('{"id": "a", "prompt": "p", "answer": "a"}', "line 2: duplicate id 'a'"),
        ('{"id": "b", "prompt": "p", "answer": "a", "domain": "code"}', "line 2: field 'domain'"),
    ],
)
def test_bad_jsonl_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "prompt": "What is 1+1?", "answer": "\\\\boxed{2}"}\n' + line + "\n")
    config = DomainConfig(name="math", prompts=JsonlPrompts(train_path=path, eval_path=path))
    with pytest.raises(ValueError, match="bad.jsonl: line 2: ") as info:
        load_problems(config, "train")
    assert message in str(info.value)


def test_missing_or_empty_jsonl(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    source = JsonlPrompts(train_path=tmp_path / "nope.jsonl", eval_path=empty)
    config = DomainConfig(name="math", prompts=source)
    with pytest.raises(ValueError, match="nope.jsonl: cannot read"):
        load_problems(config, "train")
    with pytest.raises(ValueError, match="empty.jsonl: no problems"):
        load_problems(config, "eval")

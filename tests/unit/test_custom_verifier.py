"""A user's own reward function as a domain's verifier (`verifier: python`), and free domain
names with a verifier kind (`cascade.domains.custom`, `DomainConfig.verifier`)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from cascade.config import ConfigError, DomainConfig, PythonReward, parse_cascade_yaml, parse_domain_config
from cascade.domains import load_problems, make_domain
from cascade.domains.base import INFRA_ERROR, NO_ANSWER, OK, WRONG_ANSWER, Problem

FUNCTIONS = """
import math, time

def exact(completion, answer, *, prompt, meta, bonus=0.0):
    return (1.0 if completion.strip() == answer else 0.0) + bonus

def mapping(completion, answer, *, prompt, meta):
    return {"reward": 0.25, "reason": "wrong_answer", "detail": f"{meta.get('k')} {prompt}"}

def raises(completion, answer, **kw):
    raise RuntimeError("my bug")

def slow(completion, answer, **kw):
    time.sleep(30)
    return 1.0

def nan(completion, answer, **kw):
    return math.nan

def a_string(completion, answer, **kw):
    return "1.0"

def claims_infra(completion, answer, **kw):
    return {"reward": 1.0, "reason": "infra_error"}
"""


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(FUNCTIONS))
    return tmp_path


def _domain(functions: Path, name: str, **extra: object) -> object:
    reward = PythonReward(function=f"my_rewards:{name}", python_path=[functions], time_limit_s=1, **extra)
    return make_domain(DomainConfig(name="mine", reward=reward))


def _problem(answer: str = "42") -> Problem:
    return Problem("mine-train-0", "mine", "What is six times seven?", answer, {"k": "v"})


def test_the_function_scores_the_response_after_the_reasoning(functions: Path) -> None:
    domain = _domain(functions, "exact", options={"bonus": 0.0})
    completions = ["<think>maybe 41</think>42", "<think>42</think>41", "<think>it is 42", "42"]
    got = domain.score_batch([_problem()] * 4, completions)  # type: ignore[attr-defined]
    assert [(v.reward, v.reason) for v in got] == [
        (1.0, OK),
        (0.0, WRONG_ANSWER),
        (0.0, NO_ANSWER),
        (1.0, OK),
    ]


def test_options_a_mapping_and_the_pass_threshold(functions: Path) -> None:
    bonus = _domain(functions, "exact", options={"bonus": 0.5}, pass_threshold=0.5)
    assert [v.reason for v in bonus.score_batch([_problem()] * 2, ["42", "7"])] == [OK, OK]  # type: ignore[attr-defined]
    (v,) = _domain(functions, "mapping").score_batch([_problem()], ["x"])  # type: ignore[attr-defined]
    assert (v.reward, v.reason, v.detail) == (0.25, WRONG_ANSWER, "v What is six times seven?")


@pytest.mark.parametrize(
    ("name", "detail"),
    [
        ("raises", "RuntimeError"),
        ("nan", "finite number"),
        ("a_string", "finite number"),
        ("claims_infra", "reason 'infra_error'"),
        ("slow", "took over its 1s"),
    ],
)
def test_a_failing_function_is_infra_error_never_zero(functions: Path, name: str, detail: str) -> None:
    domain = _domain(functions, name)
    start = time.monotonic()
    (v,) = domain.score_batch([_problem()], ["42"])  # type: ignore[attr-defined]
    assert v.reason == INFRA_ERROR and v.is_infra_error and detail in v.detail, v
    assert time.monotonic() - start < 20  # the slow one is killed at its limit


def test_a_function_that_does_not_import_fails_when_prepared(functions: Path) -> None:
    for function, why in (("my_rewards:absent", "has no function"), ("no_such_module:f", "cannot import")):
        domain = make_domain(
            DomainConfig(name="mine", reward=PythonReward(function=function, python_path=[functions]))
        )
        with pytest.raises(ValueError, match=why):
            domain.prepare()  # type: ignore[attr-defined]


def test_domain_names_are_free_and_the_kind_is_a_field() -> None:
    assert DomainConfig(name="gsm8k", verifier="math").kind == "math"
    assert DomainConfig(name="math").kind == "math"
    assert DomainConfig(name="hard-math", reward={"kind": "math", "timeout_s": 2}).kind == "math"
    with pytest.raises(ConfigError, match="needs a verifier"):
        parse_domain_config({"name": "gsm8k"})
    with pytest.raises(ConfigError, match="does not match verifier"):
        parse_domain_config({"name": "gsm8k", "verifier": "math", "reward": {"kind": "code"}})
    with pytest.raises(ConfigError, match="needs `reward: {kind: python"):
        parse_domain_config({"name": "mine", "verifier": "python"})
    with pytest.raises(ConfigError, match="name"):
        parse_domain_config({"name": "Bad Name", "verifier": "math"})
    # a second data set of a kind: its own problems, labelled with its own name
    problems = load_problems(DomainConfig(name="more-math", verifier="math"), "eval")
    assert problems and {p.domain for p in problems} == {"more-math"}
    domain = make_domain(DomainConfig(name="more-math", verifier="math"))
    assert domain.name == "math" and domain.score_batch(problems[:1], [problems[0].answer])[0].reason == OK


def test_a_python_domain_needs_problems_of_its_own() -> None:
    yaml = """
name: x
model: {path: /m}
domains:
  - name: mine
    reward: {kind: python, function: my_rewards:exact}
stages:
  - domain: mine
"""
    with pytest.raises(ConfigError, match="domains.0.prompts: domain 'mine' \\(python\\) has no problems"):
        parse_cascade_yaml(yaml)

"""Nemotron-Cascade 2's stages and the loop that closes the cascade. Stages over several domains
(multi-domain RL, mopd): the config's rules, the split of a step's prompts by shares, each
domain's step metrics, the teachers of each kind of stage, and one frozen copy of a checkpoint
several domains' teachers share. The regression gate: which domains it watches, when a domain
has fallen (the interval test), the best checkpoints' intervals kept across a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cascade.config import ConfigError, parse_cascade_config
from cascade.domains.base import INFRA_ERROR, OK, WRONG_ANSWER, Problem, RewardVerdict
from cascade.rollout.requests import RolloutBatch
from cascade.runner.domain_mix import per_domain_metrics, prompt_counts
from cascade.runner.frozen_models import FrozenModelCache


def _cascade2(**mopd: Any) -> dict[str, Any]:
    """if -> multi-domain (math, code) -> mopd (if, math, code) -> code."""
    return {
        "name": "unit",
        "model": {"path": "/nonexistent/model"},
        "domains": [{"name": "if"}, {"name": "math"}, {"name": "code"}],
        "stages": [
            {"domain": "if"},
            {"name": "multi", "domains": {"math": 2, "code": 1}},
            {"name": "mopd", "kind": "mopd", "domains": {"if": 1, "math": 1, "code": 1}, **mopd},
            {"domain": "code"},
        ],
    }


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_cascade_config(data, "bad.yaml")
    return str(info.value)


def test_a_mixed_stage_has_its_first_domain_as_domain_and_shares_that_sum_to_one() -> None:
    cfg = parse_cascade_config(_cascade2())
    multi, mopd = cfg.stages[1], cfg.stages[2]
    assert multi.domain == "math" and multi.domain_label == "math+code" and multi.label == "multi"
    assert multi.mix == pytest.approx({"math": 2 / 3, "code": 1 / 3})
    assert cfg.stages[0].mix == {"if": 1.0} and cfg.stages[0].label == "if"
    assert mopd.kind == "mopd" and mopd.domain_label == "if+math+code"
    # the dump reads back as the same config (domain is written beside domains)
    again = parse_cascade_config(cfg.model_dump(mode="json"))
    assert again == cfg


def test_teachers_of_each_kind_of_stage() -> None:
    cfg = parse_cascade_config(_cascade2())
    assert cfg.teachers_for(1) == ["if"]  # earlier domains, none of its own
    assert cfg.teachers_for(2) == ["if", "math", "code"]  # mopd: each of its domains' own best
    assert cfg.teachers_for(3) == ["if", "math"]  # code is its own domain


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        (lambda d: d["stages"][1]["domains"].update(code=0), "stages.1", "share must be a finite number > 0"),
        (lambda d: d["stages"][1]["domains"].update(rlhf=1), "stages.1.domains", "'rlhf' is not in domains"),
        (lambda d: d["stages"][1].update(domain="code"), "stages.1", "give one of them"),
        (
            lambda d: d["stages"][2]["domains"].update(math=1) or d["stages"].pop(1),
            "stages.1.domains",
            "earlier stage",
        ),
        (lambda d: d["stages"][2].pop("domains"), "stages.2", "list the domains distilled"),
        (
            lambda d: d["stages"][2].update(distill={"enabled": False}),
            "stages.2",
            "distillation is the whole stage",
        ),
    ],
    ids=["zero-share", "unknown-domain", "domain-not-first", "mopd-untrained", "mopd-no-domains", "mopd-off"],
)
def test_bad_mixes_fail_naming_the_field(edit: Any, field: str, reason: str) -> None:
    data = _cascade2()
    edit(data)
    msg = _error(data)
    assert field in msg and reason in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("total", "shares", "expected"),
    [
        (16, {"math": 0.5, "code": 0.5}, {"math": 8, "code": 8}),
        (16, {"math": 2 / 3, "code": 1 / 3}, {"math": 11, "code": 5}),  # 10.67 / 5.33: the rest to math
        (10, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, {"a": 4, "b": 3, "c": 3}),  # ties: the earlier
        (2, {"a": 0.1, "b": 0.9}, {"a": 0, "b": 2}),
        (7, {"a": 1.0}, {"a": 7}),
    ],
)
def test_prompt_counts_split_by_largest_remainder(total: int, shares: dict, expected: dict) -> None:
    counts = prompt_counts(total, shares)
    assert counts == expected and sum(counts.values()) == total


def _batch() -> RolloutBatch:
    """Three groups of 2: math (1, 0), code (1, 1: no signal), math (0, infra error)."""
    problems = [
        Problem(id="m0", domain="math", prompt="q", answer="1"),
        Problem(id="c0", domain="code", prompt="q", answer=""),
        Problem(id="m1", domain="math", prompt="q", answer="1"),
    ]
    verdicts = [
        RewardVerdict(1.0, OK),
        RewardVerdict(0.0, WRONG_ANSWER),
        RewardVerdict(1.0, OK),
        RewardVerdict(1.0, OK),
        RewardVerdict(0.0, WRONG_ANSWER),
        RewardVerdict(0.0, INFRA_ERROR, "worker died"),
    ]
    return RolloutBatch(
        domain="math",
        problems=problems,
        group_size=2,
        prompt_ids=[[3]] * 6,
        completion_ids=[[4]] * 6,
        logprobs=[[-1.0]] * 6,
        finish_reasons=["stop"] * 6,
        texts=[""] * 6,
        verdicts=verdicts,
        policy_version=0,
        temperature=1.0,
    )


def test_per_domain_metrics_by_hand() -> None:
    m = per_domain_metrics(_batch())
    assert m["groups/math"] == 2 and m["groups/code"] == 1
    assert m["reward_mean/math"] == pytest.approx(1 / 3)  # 1, 0, 0 (the failed sample is out)
    assert m["reward_mean/code"] == 1.0
    # math: group m0 has signal, m1's one counted sample is a group of equal rewards
    assert m["zero_variance_groups/math"] == 0.5
    assert m["zero_variance_groups/code"] == 1.0


def test_frozen_models_share_one_copy_per_checkpoint(random_tiny_model: Path, tmp_path: Path) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(random_tiny_model, other)
    cache = FrozenModelCache("float32")
    a = cache.get("math", random_tiny_model)
    b = cache.get("code", random_tiny_model)
    assert a is b and cache.loads == 1  # two domains, one checkpoint: one model
    c = cache.get("math", other)  # math's teacher replaced: code still holds the first
    assert c is not a and cache.loads == 2
    assert cache.get("code", random_tiny_model) is a and cache.loads == 2
    cache.get("code", other)  # nobody holds the first any more: it is dropped, the second shared
    assert cache.loads == 2 and len(cache._models) == 1


# --------------------------------------------------------------------------- the regression gate


def _eval(domain: str, score: float, low: float, high: float) -> Any:
    from cascade.eval.results import DomainEval, MetricValue

    return DomainEval(domain, score, 64, {}, {"greedy": MetricValue(score, low, high, 64, "wilson")})


def test_a_domain_falls_only_when_its_interval_lies_wholly_below_its_best() -> None:
    from cascade.runner.curriculum import TeacherEntry
    from cascade.runner.gate import fallen_domains

    best = {
        "math": TeacherEntry("t/math", 0.30, 10, low=0.20, high=0.41),
        "code": TeacherEntry("t/code", 0.30, 12, low=0.20, high=0.41),
        "if": TeacherEntry("t/if", 0.30, 14),  # no interval kept: never called fallen
        "rlhf": None,  # no best checkpoint yet
    }
    evals = {
        "math": _eval("math", 0.05, 0.01, 0.19),  # 0.19 < 0.20: outside noise
        "code": _eval("code", 0.12, 0.06, 0.22),  # overlaps [0.20, 0.41]: within noise
        "if": _eval("if", 0.0, 0.0, 0.05),
        "rlhf": _eval("rlhf", 0.0, 0.0, 0.05),
    }
    fallen = fallen_domains(["math", "code", "if", "rlhf"], evals, best)
    assert [f.domain for f in fallen] == ["math"]
    f = fallen[0]
    assert (f.best_step, f.best, f.best_low, f.best_high) == (10, 0.30, 0.20, 0.41)
    assert (f.now, f.now_low, f.now_high) == (0.05, 0.01, 0.19)
    assert "math 5.0% [1.0%, 19.0%] below its best 30.0% [20.0%, 41.0%] (step 10)" == f.describe()
    assert fallen_domains(["code"], evals, best) == []


def test_gate_domains_and_their_checks() -> None:
    data = _cascade2()
    data["stages"][3]["gate"] = {"enabled": True}
    cfg = parse_cascade_config(data)
    assert cfg.guarded_by_gate(3) == ["if", "math"]  # earlier domains, not its own (code)
    assert cfg.guarded_by_gate(1) == []  # off
    assert cfg.gate_domains(1) == ["if"]  # what the drift warning would watch
    data["stages"][1]["gate"] = {"enabled": True, "domains": ["code"]}
    msg = _error(data)
    assert "stages.1.gate.domains" in msg and "'code' is not trained in an earlier stage" in msg


def test_teacher_intervals_survive_the_saved_state() -> None:
    from cascade.runner.curriculum import TeacherRegistry

    reg = TeacherRegistry()
    assert reg.offer("math", 0.3, 10, "t/a", (0.2, 0.41))
    assert not reg.offer("math", 0.3, 12, "t/b", (0.25, 0.35))  # a tie keeps the earlier
    again = TeacherRegistry()
    again.load_state_dict(reg.state_dict())
    entry = again.teacher("math")
    assert entry is not None and (entry.low, entry.high, entry.path) == (0.2, 0.41, "t/a")
    old_state = {"teachers": {"math": {"path": "t/a", "score": 0.3, "step": 10}}}  # before intervals
    again.load_state_dict(old_state)
    entry = again.teacher("math")
    assert entry is not None and entry.low is None and entry.high is None

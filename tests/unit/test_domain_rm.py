"""Reward-model verifier: tiny RM training, scoring, thinking-invariance, shaping, splits."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from cascade.domains.base import INFRA_ERROR, NO_ANSWER, OK, Problem
from cascade.domains.common import split_of
from cascade.domains.rm import NO_ANSWER_FALLBACK, RewardModelScorer, RlhfDomain, shape_group
from cascade.model.reward_model import build_tiny_reward_model, make_rlhf_problems


@pytest.fixture(scope="module")
def rm_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("tiny_rm")
    metrics = build_tiny_reward_model(out, seed=0, log=lambda _msg: None)
    return out, metrics


@pytest.fixture(scope="module")
def scorer(rm_build: tuple[Path, dict[str, Any]]) -> RewardModelScorer:
    return RewardModelScorer(rm_build[0], batch_size=16)


def test_build_saves_model_and_reports_heldout_accuracy(rm_build: tuple[Path, dict[str, Any]]) -> None:
    out, metrics = rm_build
    assert (out / "model.safetensors").is_file()
    assert (out / "config.json").is_file()
    assert (out / "tokenizer.json").is_file()
    assert metrics["eval_pairs"] > 0
    assert metrics["eval_pairwise_accuracy"] > 0.8


def test_scorer_ranks_chosen_above_rejected_on_heldout(scorer: RewardModelScorer) -> None:
    problems = make_rlhf_problems("eval", 30, 0)
    prompts = [p.prompt for p in problems]
    chosen = scorer.score(prompts, [p.answer for p in problems])
    wins = total = 0
    for k in range(3):
        rejected = scorer.score(prompts, [p.meta["rejected"][k] for p in problems])
        wins += sum(c > r for c, r in zip(chosen, rejected, strict=True))
        total += len(problems)
    assert wins / total > 0.8


def test_thinking_text_does_not_change_score(scorer: RewardModelScorer) -> None:
    domain = RlhfDomain(scorer)
    problem = make_rlhf_problems("eval", 1, 0)[0]
    bare = problem.answer
    thought = f"<think>\nThe user is rude? No way. Go away, idiot. {'um ' * 20}\n</think>\n\n{problem.answer}"
    empty_think = f"<think>\n\n</think>\n\n{problem.answer}"
    # Mixed lengths in one batch: padding must not move the score either.
    verdicts = domain.score_batch([problem] * 3, [bare, thought, empty_think])
    assert [v.reason for v in verdicts] == [OK, OK, OK]
    assert verdicts[1].reward == pytest.approx(verdicts[0].reward, abs=1e-4)
    assert verdicts[2].reward == pytest.approx(verdicts[0].reward, abs=1e-4)
    alone = domain.score_batch([problem], [bare])[0]
    assert alone.reward == pytest.approx(verdicts[0].reward, abs=1e-4)


def test_empty_and_unclosed_answers_are_no_answer(scorer: RewardModelScorer) -> None:
    domain = RlhfDomain(scorer)
    p = make_rlhf_problems("eval", 1, 0)[0]
    completions = [
        p.answer,
        p.meta["rejected"][0],
        "<think>only thoughts</think>  ",
        "<think>never closed",
        "",
    ]
    verdicts = domain.score_batch([p] * len(completions), completions)
    assert [v.reason for v in verdicts] == [OK, OK, NO_ANSWER, NO_ANSWER, NO_ANSWER]
    lowest = min(verdicts[0].reward, verdicts[1].reward)
    for v in verdicts[2:]:
        assert v.reward == lowest
    assert "unclosed" in verdicts[3].detail
    # No scored completion in the batch: the fixed fallback.
    only_empty = domain.score_batch([p], ["<think>x</think>"])
    assert only_empty[0].reason == NO_ANSWER and only_empty[0].reward == NO_ANSWER_FALLBACK


def test_model_failure_is_infra_error_not_zero(scorer: RewardModelScorer, monkeypatch) -> None:
    domain = RlhfDomain(scorer)
    p = make_rlhf_problems("eval", 1, 0)[0]

    def boom(prompts, responses):
        raise RuntimeError("CUDA fell over")

    monkeypatch.setattr(scorer, "score_chunk", boom)
    verdicts = domain.score_batch([p, p], [p.answer, ""])
    assert verdicts[0].reason == INFRA_ERROR and verdicts[0].is_infra_error
    assert "CUDA fell over" in verdicts[0].detail
    assert verdicts[1].reason == NO_ANSWER and verdicts[1].reward == NO_ANSWER_FALLBACK


def test_group_tanh_shaping_in_domain(rm_build: tuple[Path, dict[str, Any]]) -> None:
    shaped_scorer = RewardModelScorer(rm_build[0], shaping="group_tanh")
    raw = RlhfDomain(RewardModelScorer(rm_build[0]))
    domain = RlhfDomain(shaped_scorer)
    a, b = make_rlhf_problems("eval", 2, 0)
    problems = [a, a, a, b, b]
    completions = [a.answer, a.meta["rejected"][0], a.meta["rejected"][1], b.answer, b.answer]
    raw_v = raw.score_batch(problems, completions)
    verdicts = domain.score_batch(problems, completions)
    expected = shape_group([v.reward for v in raw_v[:3]], 3)
    assert [v.reward for v in verdicts[:3]] == pytest.approx(expected, abs=1e-5)
    assert verdicts[0].reward > 0 > verdicts[1].reward
    assert [v.reward for v in verdicts[3:]] == [0.0, 0.0]  # equal completions -> no preference


def test_shape_group_hand_checked() -> None:
    t = math.tanh(math.sqrt(1.5))  # z of 1 and 3 in [1, 2, 3]: +-1 / sqrt(2/3)
    assert shape_group([1.0, 2.0, 3.0], 3) == pytest.approx([-t, 0.0, t])
    assert shape_group([5.0, 5.0, 5.0, 0.0, 2.0, 4.0], 3) == pytest.approx([0.0, 0.0, 0.0, -t, 0.0, t])
    assert shape_group([-2.0, 2.0], 2) == pytest.approx([math.tanh(-1.0), math.tanh(1.0)])
    assert shape_group([7.0], 1) == [0.0]
    assert shape_group([], 4) == []
    with pytest.raises(ValueError):
        shape_group([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError):
        shape_group([1.0], 0)


def test_broken_model_path_is_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RewardModelScorer(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot load a reward model"):
        RewardModelScorer(tmp_path)


def test_splits_disjoint_and_deterministic() -> None:
    sets = {s: make_rlhf_problems(s, 40, 3) for s in ("train", "eval", "sft")}
    prompts = {s: {p.prompt for p in ps} for s, ps in sets.items()}
    assert not prompts["train"] & prompts["eval"]
    assert not prompts["train"] & prompts["sft"]
    assert not prompts["eval"] & prompts["sft"]
    for s, ps in sets.items():
        assert len(prompts[s]) == 40
        assert all(split_of(p.prompt) == s for p in ps)
        assert all(isinstance(p, Problem) and p.domain == "rlhf" for p in ps)
        assert ps[0].id == f"rlhf-{s}-0"
        assert ps == make_rlhf_problems(s, 40, 3)
    other_seed = {p.prompt for p in make_rlhf_problems("eval", 40, 4)}
    assert not other_seed & prompts["train"]
    with pytest.raises(ValueError):
        make_rlhf_problems("test", 1, 0)


def test_domain_make_problems_delegates(scorer: RewardModelScorer) -> None:
    domain = RlhfDomain(scorer)
    assert domain.name == "rlhf"
    assert domain.make_problems("sft", 5, 1) == make_rlhf_problems("sft", 5, 1)
    p = domain.make_problems("train", 1, 0)[0]
    assert p.meta["kinds"] == ["rude", "off_topic", "rambling"]
    assert p.answer.startswith(("Of course", "Certainly", "Sure", "Gladly"))


def test_rlhf_domain_from_config(rm_build: tuple[Path, dict[str, Any]]) -> None:
    """The config wires the domain: `reward: {kind: rlhf, model_path: ...}` is required."""
    from pydantic import ValidationError

    from cascade.config import DomainConfig, RlhfReward
    from cascade.domains import make_domain

    with pytest.raises(ValidationError, match="rlhf domain needs"):
        DomainConfig(name="rlhf")
    domain = make_domain(DomainConfig(name="rlhf", reward=RlhfReward(model_path=rm_build[0])))
    problem = domain.make_problems("eval", 1, 0)[0]
    verdicts = domain.score_batch([problem, problem], [problem.answer, ""])
    assert verdicts[0].reason == "ok" and verdicts[1].reason == "no_answer"
    # An empty answer gets the batch's lowest score: here the only scored completion's.
    assert verdicts[1].reward == pytest.approx(verdicts[0].reward)


def test_reference_baseline_is_bradley_terry_win_probability(scorer: RewardModelScorer) -> None:
    domain = RlhfDomain(scorer, baseline="reference")
    a, b = make_rlhf_problems("eval", 2, 0)
    completions = [a.answer, a.meta["rejected"][0], "", b.meta["rejected"][2]]
    verdicts = domain.score_batch([a, a, a, b], completions)
    raw = scorer.score(
        [a.prompt, a.prompt, b.prompt, a.prompt, b.prompt],
        [*completions[:2], completions[3], a.answer, b.answer],
    )
    ref_a, ref_b = raw[3], raw[4]
    assert verdicts[0].reward == pytest.approx(0.5, abs=1e-6)  # the reference itself: a coin flip
    assert verdicts[1].reward == pytest.approx(1 / (1 + math.exp(-(raw[1] - ref_a))), abs=1e-5)
    assert verdicts[1].reward < 0.5  # rude loses to the reference
    assert (verdicts[2].reason, verdicts[2].reward) == (NO_ANSWER, 0.0)  # the lowest possible
    assert verdicts[3].reward == pytest.approx(1 / (1 + math.exp(-(raw[2] - ref_b))), abs=1e-5)
    assert all(0.0 <= v.reward <= 1.0 for v in verdicts)
    with pytest.raises(ValueError, match="baseline"):
        RlhfDomain(scorer, baseline="mean")  # type: ignore[arg-type]


def test_reference_failure_is_infra_error(scorer: RewardModelScorer, monkeypatch) -> None:
    domain = RlhfDomain(scorer, baseline="reference")
    p = make_rlhf_problems("eval", 1, 0)[0]
    real = scorer.score_chunk

    def fail_on_reference(prompts, responses):
        if p.answer in responses:
            raise RuntimeError("reference broke")
        return real(prompts, responses)

    monkeypatch.setattr(scorer, "score_chunk", fail_on_reference)
    verdicts = domain.score_batch([p], [p.meta["rejected"][0]])
    assert verdicts[0].is_infra_error and "reference broke" in verdicts[0].detail


def test_eval_is_unshaped_even_when_training_is_shaped(rm_build: tuple[Path, dict[str, Any]]) -> None:
    """An eval has one completion per problem: shaped, every score would be 0."""
    from cascade.domains.base import score_for_eval

    shaped = RlhfDomain(RewardModelScorer(rm_build[0], shaping="group_tanh"))
    raw = RlhfDomain(RewardModelScorer(rm_build[0]))
    problems = make_rlhf_problems("eval", 3, 0)
    completions = [problems[0].answer, problems[1].meta["rejected"][0], problems[2].meta["rejected"][1]]
    assert [v.reward for v in shaped.score_batch(problems, completions)] == [0.0, 0.0, 0.0]
    expected = [v.reward for v in raw.score_batch(problems, completions)]
    assert [v.reward for v in score_for_eval(shaped, problems, completions)] == pytest.approx(expected)
    assert len(set(expected)) == 3

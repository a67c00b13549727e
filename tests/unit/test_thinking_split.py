"""Reasoning and answer are split on the reasoning markers the model sampled, in every path that
turns sampled ids into the text a verifier reads (issue 33).

The tiny tokenizer makes `<think>`/`</think>` special tokens, and every path decoded with
`skip_special_tokens=True`: the markers vanished before the verifier saw the text, so an answer
written only inside the reasoning was paid (math 1.0) and a right answer after reasoning was
judged with the reasoning in front of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cascade.config import DomainConfig
from cascade.domains import load_problems, make_domain
from cascade.engine.base import Generation, SamplingSettings, VersionedGeneration
from cascade.model.chat import completion_decoder
from cascade.rollout.requests import PromptRequest

MATH = DomainConfig.model_validate(
    {"name": "math", "prompts": {"kind": "synthetic", "seed": 0, "n_train": 4}}
)


@pytest.fixture(scope="module")
def tokenizer(random_tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(random_tiny_model))


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def _completions(tokenizer: PreTrainedTokenizerBase, gold: str, wrong: str) -> dict[str, list[int]]:
    """What a policy may sample, by what it deserves."""
    return {
        "only_in_reasoning": _ids(
            tokenizer, f"<think>\nso it is \\boxed{{{gold}}}\n</think>\n\nI am not sure."
        ),
        "wrong_after_reasoning": _ids(
            tokenizer, f"<think>\n\\boxed{{{gold}}}\n</think>\n\n\\boxed{{{wrong}}}"
        ),
        "right_after_reasoning": _ids(tokenizer, f"<think>\nadd them up\n</think>\n\n\\boxed{{{gold}}}"),
        "left_open": _ids(tokenizer, f"<think>\n\\boxed{{{gold}}}"),
    }


EXPECTED = {
    "only_in_reasoning": 0.0,
    "wrong_after_reasoning": 0.0,
    "right_after_reasoning": 1.0,
    "left_open": 0.0,
}


def test_the_decoder_keeps_the_reasoning_markers_and_drops_every_other_special_token(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    ids = [tokenizer.convert_tokens_to_ids("<|im_start|>")] + _ids(tokenizer, "<think>\nx\n</think>\n\n12")
    assert tokenizer.convert_tokens_to_ids("<think>") in tokenizer.added_tokens_decoder  # special here
    assert completion_decoder(tokenizer)([ids]) == ["<think>\nx\n</think>\n\n12"]
    assert tokenizer.batch_decode([ids], skip_special_tokens=True) == ["\nx\n\n\n12"]  # what was read


class ScriptedEngine:
    """Stands in for the policy's sampling: hands back the scripted completions."""

    def __init__(self, completions: list[list[int]]) -> None:
        self.completions = completions

    def __call__(
        self, prompt_ids: list[list[int]], n: int, settings: SamplingSettings
    ) -> VersionedGeneration:
        rows = self.completions
        gen = Generation(rows, [[0.0] * len(r) for r in rows], ["stop"] * len(rows))
        return VersionedGeneration(gen, version=0, n=n)


def _problem_and_scripts(tokenizer: PreTrainedTokenizerBase) -> tuple[Any, list[str], list[list[int]]]:
    problem = load_problems(MATH, "train")[0]
    gold = problem.answer.removeprefix("\\boxed{").removesuffix("}")
    scripts = _completions(tokenizer, gold, str(int(gold) + 1))
    return problem, list(scripts), list(scripts.values())


def test_the_embedded_rollouts_judge_the_answer_after_the_reasoning(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    from cascade.runner.local import LocalRollouts

    problem, names, scripts = _problem_and_scripts(tokenizer)
    rollouts = LocalRollouts({"math": make_domain(MATH)})
    rollouts._engine = ScriptedEngine(scripts)  # type: ignore[assignment]
    rollouts._engine.policy = type("P", (), {"tokenizer": tokenizer})()  # type: ignore[attr-defined]
    req = PromptRequest(
        batch=0, index=0, domain="math", policy_version=0, seed=0, group_size=len(scripts), max_tokens=64,
        temperature=1.0, top_p=1.0, overlong="mask", problems=[problem.__dict__], prompt_ids=[[1]],
        sample_ids=[f"s{i}" for i in range(len(scripts))], attempt="a",
    )  # fmt: skip
    rollouts.submit([req])
    (chunk,) = rollouts.collect(0)
    rewards = [reward for reward, _, _ in chunk.verdicts]
    assert dict(zip(names, rewards, strict=True)) == EXPECTED


def test_the_eval_judges_the_answer_after_the_reasoning(tokenizer: PreTrainedTokenizerBase) -> None:
    from cascade.eval.evaluate import _completions as eval_completions

    problem, names, scripts = _problem_and_scripts(tokenizer)
    domain = make_domain(MATH)
    repeated = [problem] * len(scripts)
    settings = SamplingSettings(max_tokens=64)
    texts, _ = eval_completions(
        ScriptedEngine(scripts), tokenizer, domain, repeated, [[1]], len(scripts), settings, True
    )
    rewards = [v.reward for v in domain.score_batch(repeated, texts)]
    assert dict(zip(names, rewards, strict=True)) == EXPECTED


def test_the_rollout_worker_decodes_with_the_markers(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    import cascade.rollout.scoring
    import cascade.transport.redis_streams
    from cascade.resilience import Dependency
    from cascade.rollout.requests import ScoredChunk
    from services.rollout.worker import Worker

    seen: list[str] = []

    def spy(got: PromptRequest, **kwargs: Any) -> ScoredChunk:
        seen.extend(kwargs["decode"]([_ids(tokenizer, "<think>\nx\n</think>\n\n12")]))
        return ScoredChunk(0, 0, "w", 0, [], [], [], [], [], [], attempt="a")

    monkeypatch.setattr(cascade.rollout.scoring, "generate_and_score", spy)
    monkeypatch.setattr(cascade.transport.redis_streams, "publish", lambda *a, **k: None)
    worker = object.__new__(Worker)
    worker.args = argparse.Namespace(name="w", fault_hold_s=0.0, fault_at="before_generate")
    worker.faulted, worker.redis, worker.tokenizer = False, None, tokenizer
    worker.redis_outage = Dependency("redis", give_up_after_s=0.0, transient=(ConnectionError,), log=print)
    worker.keys = cascade.transport.redis_streams.StreamKeys("test")
    worker.requests = argparse.Namespace(ack=lambda mid: None)
    req = PromptRequest(
        batch=0, index=0, domain="math", policy_version=0, seed=0, group_size=1, max_tokens=4,
        temperature=1.0, top_p=1.0, overlong="mask", problems=[], prompt_ids=[], sample_ids=[], attempt="a",
    )  # fmt: skip
    worker.handle("1-0", req.to_json())
    assert seen == ["<think>\nx\n</think>\n\n12"]

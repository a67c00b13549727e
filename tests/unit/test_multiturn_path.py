"""The per-token layout through the whole path: an agent request's `generate_and_score` runs the
turn loop and its chunk carries the layout (through JSON, as over Redis), `merge_chunks` gives
the batch its layouts, `plan_rl` keeps them with the rows it trains, and the GRPO loss counts
only the model's tokens (a two-turn batch whose tool tokens would change the loss if counted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from scripted_turns import ScriptedEngine, call, store_problem
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cascade.algo import group_advantages
from cascade.algo.grpo import GrpoLossInput, grpo_loss
from cascade.algo.turn_mask import TurnLayout
from cascade.config import ChatConfig, GrpoConfig
from cascade.domains.agent import AgentDomain
from cascade.domains.base import Problem, RewardVerdict
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logprobs
from cascade.model.chat import encode_prompts, token_encoder
from cascade.model.loading import load_policy
from cascade.rollout.requests import (
    PromptRequest,
    RolloutBatch,
    ScoredChunk,
    chunk_layouts,
    merge_chunks,
    problem_fields,
)
from cascade.rollout.scoring import generate_and_score
from cascade.runner.rl import plan_rl, rl_loss
from cascade.tools.builtin import ToolUnavailable
from cascade.tools.environment import StepResult, ToolEnvironment
from cascade.tools.turn_loop import turn_metrics


@pytest.fixture(scope="module")
def tokenizer(random_tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(random_tiny_model))


def _request(problems: list[Problem], prompt_ids: list[list[int]], domain: str = "agent") -> PromptRequest:
    return PromptRequest(
        batch=0,
        index=0,
        domain=domain,
        policy_version=0,
        seed=11,
        group_size=1,
        max_tokens=400,
        temperature=1.0,
        top_p=1.0,
        overlong="none",
        problems=[problem_fields(p) for p in problems],
        prompt_ids=prompt_ids,
        sample_ids=[[f"b0/{p.id}/0"] for p in problems],
        reward_config={"kind": "agent", "max_turns": 4} if domain == "agent" else None,
    )


def _score(
    domain: str, problems: list[Problem], texts: list[str], cfg: dict[str, Any] | None
) -> list[RewardVerdict]:
    return AgentDomain().score_batch(problems, texts)


def test_agent_request_carries_its_layout_to_the_batch(tokenizer: PreTrainedTokenizerBase) -> None:
    right = store_problem("r", {"plum": 3}, ["plum"], "3")
    wrong = store_problem("w", {"fig": 5}, ["fig"], "5")
    problems = [right, wrong]
    prompts = encode_prompts(tokenizer, ChatConfig(), [p.prompt for p in problems], False)
    engine = ScriptedEngine(tokenizer, prompts, [[call("kv_get", key="plum"), "3"], ["4"]])
    decode = lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
    req = _request(problems, prompts)
    chunk = generate_and_score(
        req, generate_fn=engine, decode=decode, score=_score, worker="t", encode=token_encoder(tokenizer)
    )
    assert [v[:2] for v in chunk.verdicts] == [(1.0, "ok"), (0.0, "wrong_answer")]
    assert [[m for _, m in runs] for runs in chunk.layouts] == [[1, 0, 1], [1]]
    assert chunk.engine_version == 1  # the oldest weights of any round
    again = ScoredChunk.from_json(json.loads(json.dumps(chunk.to_json())))  # as over Redis
    assert again == chunk
    batch = merge_chunks([req], [again], policy_version=0, temperature=1.0)
    assert batch.layouts == chunk_layouts(chunk)
    assert [lay.length for lay in batch.layouts] == [len(c) for c in batch.completion_ids]
    # the loop's tool counts ride along into the step metrics
    assert [e["calls"] for e in batch.episodes] == [1.0, 0.0]
    metrics = turn_metrics(batch.episodes)
    assert metrics["turns/calls_per_episode"] == 0.5 and metrics["turns/turns_per_episode"] == 1.5
    assert metrics["turns/malformed_call_rate"] == 0.0
    # a single-turn domain's request is one generation and carries no layout
    plain = ScriptedEngine(tokenizer, prompts, [["3"], ["4"]])
    single = generate_and_score(
        _request(problems, prompts, domain="math"),
        generate_fn=plain,
        decode=decode,
        score=lambda *a: [RewardVerdict(0.0, "x")] * 2,
        worker="t",
    )
    assert single.layouts == [] and len(plain.calls) == 1
    assert merge_chunks([req], [single], policy_version=0, temperature=1.0).layouts == []


def test_grpo_loss_trains_only_the_model_tokens_of_a_two_turn_batch(random_tiny_model: Path) -> None:
    policy = load_policy(random_tiny_model)
    torch.manual_seed(0)
    vocab = 300
    prompt = torch.randint(5, vocab, (6,)).tolist()
    two_turn = TurnLayout.of_pieces(
        [
            (torch.randint(5, vocab, (3,)).tolist(), True),
            (torch.randint(5, vocab, (4,)).tolist(), False),
            (torch.randint(5, vocab, (2,)).tolist(), True),
        ]
    )
    one_turn = TurnLayout.of_pieces([(torch.randint(5, vocab, (4,)).tolist(), True)])
    layouts = [two_turn[0], one_turn[0]]
    completions = [two_turn[1], one_turn[1]]
    sb = build_batch([prompt, prompt], completions, policy.pad_token_id)
    with torch.no_grad():
        engine_lp = completion_logprobs(policy.model, sb, 1.0)
    # the engine's log-probs exist only at the model's tokens (0.0 at the tool's, as scattered)
    behaviour = [
        lay.scatter([float(engine_lp[r, i]) for i, m in enumerate(lay.model_mask()) if m])
        for r, lay in enumerate(layouts)
    ]

    def batch(with_layouts: bool, version: int) -> RolloutBatch:
        return RolloutBatch(
            domain="agent",
            problems=[store_problem("p", {"plum": 3}, ["plum"], "3")],
            group_size=2,
            prompt_ids=[prompt, prompt],
            completion_ids=completions,
            logprobs=behaviour,
            finish_reasons=["stop", "stop"],
            texts=["", ""],
            verdicts=[RewardVerdict(1.0, "ok"), RewardVerdict(0.0, "wrong_answer")],
            policy_version=version,
            temperature=1.0,
            layouts=layouts if with_layouts else [],
        )

    cfg = GrpoConfig(group_size=2, loss_aggregation="token")

    def loss(with_layouts: bool, version: int) -> float:
        plan = plan_rl(batch(with_layouts, version), cfg, current_version=1, drop_zero_variance=True)
        assert (plan.layouts is not None) == with_layouts
        term = rl_loss(policy.model, plan, cfg, pad_id=policy.pad_token_id)
        assert term.loss is not None
        return float(term.loss.detach())

    # by hand: the loss over the mask written out (turns 1 and 2 of row 0, all 4 tokens of row 1)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    advantages = group_advantages(torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool)).flatten()
    expected = grpo_loss(
        GrpoLossInput(
            logprobs=engine_lp,
            advantages=advantages,
            mask=mask,
            group_ids=torch.tensor([0, 0]),
            aggregation="token",
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
        )
    ).loss
    on_policy = loss(True, version=1)
    assert abs(on_policy) > 1e-3  # 5 model tokens with A > 0, 4 with A < 0
    assert on_policy == pytest.approx(float(expected), abs=1e-6)
    # a stale batch: ratios against the scattered behaviour log-probs are 1 at every model token,
    # so the loss is the on-policy one; the tool tokens' 0.0 never enter a ratio
    assert loss(True, version=0) == pytest.approx(on_policy, abs=1e-6)
    # counted, the tool tokens change both
    assert abs(loss(False, version=1) - on_policy) > 1e-4
    assert abs(loss(False, version=0) - on_policy) > 1e-3


class _SandboxDown(ToolEnvironment):
    """An environment whose tool cannot run (the sandbox failed), as `PythonTool` reports it."""

    def step(self, turn_text: str) -> StepResult:
        raise ToolUnavailable("python: the sandbox failed: test")


def test_a_tool_that_cannot_run_is_an_infra_error_not_a_reward(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cascade.domains.agent as agent

    p = store_problem("s", {"plum": 3}, ["plum"], "3")
    prompts = encode_prompts(tokenizer, ChatConfig(), [p.prompt], False)
    engine = ScriptedEngine(tokenizer, prompts, [[call("kv_get", key="plum"), "3"]])
    real = agent.turn_setup

    def sandbox_down(problems: list[Problem], cfg: dict[str, Any] | None) -> agent.TurnSetup | None:
        setup = real(problems, cfg)
        assert setup is not None
        envs = [_SandboxDown(setup.format, {"plum": 3}) for _ in problems]
        return agent.TurnSetup(setup.format, list(envs), setup.max_turns)

    monkeypatch.setattr(agent, "turn_setup", sandbox_down)
    chunk = generate_and_score(
        _request([p], prompts),
        generate_fn=engine,
        decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
        score=_score,
        worker="t",
        encode=token_encoder(tokenizer),
    )
    assert chunk.finish_reasons == ["tool_unavailable"] and len(engine.calls) == 1
    assert chunk.verdicts == [(0.0, "infra_error", "python: the sandbox failed: test")]

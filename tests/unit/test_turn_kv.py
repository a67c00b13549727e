"""KV reuse between the turns of a multi-turn rollout, wired end to end: the turn loop names each
round (`TurnStep`), the name survives the rollout service's proto, and the embedded engine
(`PolicyGenerate`) and the rollout service's (`HFEngine`) take the same decisions and give the
same numbers, bit for bit; reuse agrees with a full prefill every round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from scripted_turns import ScriptedEngine, call, store_problem
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cascade.config import ChatConfig
from cascade.domains.agent import AgentDomain, turn_setup
from cascade.engine.base import SamplingSettings, TurnStep, VersionedGeneration
from cascade.engine.hf_engine import HFEngine
from cascade.model.chat import encode_prompts, token_encoder
from cascade.model.loading import Policy, load_policy
from cascade.rollout.policy import PolicyGenerate
from cascade.rollout.requests import GenerateFn, PromptRequest, problem_fields
from cascade.rollout.scoring import generate_and_score
from cascade.tools.environment import CallOutcome, StepResult, ToolEnvironment
from cascade.tools.turn_loop import TurnRollout, run_turns
from cascade.transport.rollout_client import from_response, generate_request
from services.rollout.metrics import RolloutMetrics
from services.rollout.requests import Limits, parse_generate
from services.rollout.server import RolloutServicer

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def tokenizer(random_tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(random_tiny_model))


def _policy(path: Path) -> Policy:
    """The random tiny model, with a tenth of its vocabulary ending a turn (it rarely samples
    its one end-of-turn token, and episodes must go round the loop)."""
    policy = load_policy(path)
    vocab = policy.model.config.vocab_size
    policy.model.generation_config.eos_token_id = [policy.tokenizer.eos_token_id, *range(10, vocab, 10)]
    return policy


class _Answers(ToolEnvironment):
    """Every turn is a call, answered: an episode ends only at `max_turns` or the budget."""

    def step(self, turn_text: str) -> StepResult:
        return StepResult((CallOutcome(None, "the answer is 42", "tool_error"),))


def _run(tokenizer: PreTrainedTokenizerBase, generate_fn: GenerateFn, *, keep_kv: bool) -> TurnRollout:
    domain = AgentDomain()
    problems = [store_problem("a", {"plum": 3}, ["plum"], "3"), store_problem("b", {"fig": 4}, ["fig"], "4")]
    prompts = encode_prompts(tokenizer, ChatConfig(), [p.prompt for p in problems], False)
    n = 3
    return run_turns(
        prompts,
        n,
        SamplingSettings(max_tokens=120, temperature=1.0, seed=7),
        generate_fn=generate_fn,
        decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
        encode=token_encoder(tokenizer),
        environments=[_Answers(domain.format, {}) for _ in range(len(problems) * n)],
        fmt=domain.format,
        thinking=False,
        max_turns=4,
        round_seed=lambda r: 100 + r,
        keep_kv=keep_kv,
    )


def test_embedded_and_service_engines_agree_bit_for_bit_and_with_a_full_prefill(
    random_tiny_model: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    embedded = PolicyGenerate(_policy(random_tiny_model))
    service = HFEngine(_policy(random_tiny_model), model_dir=random_tiny_model)

    metrics = RolloutMetrics()
    servicer = RolloutServicer(service, service.tokenizer, metrics)

    def over_the_wire(prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        """As a rollout worker asks: the proto request, the service's handler, the proto reply."""
        request = generate_request(prompts, group_size=n, sampling=sampling, thinking=False)
        assert parse_generate(request, service.tokenizer, ChatConfig(), Limits()).sampling == sampling
        return from_response(servicer.Generate(request, None), n).result  # type: ignore[arg-type]

    ours = _run(tokenizer, embedded, keep_kv=True)
    theirs = _run(tokenizer, over_the_wire, keep_kv=True)
    assert ours == theirs
    assert ours.rounds >= 3 and sum(s.turns >= 3 for s in ours.stats) >= 2  # rounds went on
    assert embedded.turns.reused == service.turns.reused == ours.rounds - 1
    assert embedded.turns.full == service.turns.full == 0
    count = metrics.registry.get_sample_value
    assert count("cascade_rollout_turn_rounds_total", {"kv": "reused"}) == ours.rounds - 1
    assert count("cascade_rollout_turn_rounds_total", {"kv": "full"}) is None
    assert count("cascade_rollout_turn_kv_bytes") == service.turns.nbytes > 0

    full = _run(tokenizer, PolicyGenerate(_policy(random_tiny_model)), keep_kv=False)
    assert full.completion_ids == ours.completion_ids and full.texts == ours.texts
    for a, b in zip(full.logprobs, ours.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    assert full.logprobs != ours.logprobs  # later rounds really were computed otherwise


def test_the_turn_loop_names_each_round(tokenizer: PreTrainedTokenizerBase) -> None:
    problems = [store_problem("a", {"plum": 3}, ["plum"], "3"), store_problem("b", {"fig": 4}, ["fig"], "4")]
    prompts = encode_prompts(tokenizer, ChatConfig(), [p.prompt for p in problems], False)
    # episode 0 (a) calls twice then answers; episode 1 (b) answers at once
    scripts = [[call("kv_get", key="plum"), call("calc", expression="3+1"), "4"], ["4"]]
    domain = AgentDomain()

    def run(keep_kv: bool) -> ScriptedEngine:
        engine = ScriptedEngine(tokenizer, prompts, scripts)
        run_turns(
            prompts,
            1,
            SamplingSettings(max_tokens=400, seed=7),
            generate_fn=engine,
            decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
            encode=token_encoder(tokenizer),
            environments=[domain.environment(p) for p in problems],
            fmt=domain.format,
            thinking=False,
            max_turns=8,
            round_seed=lambda r: 1000 + r,
            keep_kv=keep_kv,
        )
        return engine

    first, second = run(True), run(True)
    turns = [s.turn for _, _, s in first.calls]
    assert all(isinstance(t, TurnStep) for t in turns)
    caller, rollout = turns[0].caller, turns[0].rollout  # type: ignore[union-attr]
    assert turns == [
        TurnStep(caller, rollout, 0),
        TurnStep(caller, rollout, 1, (0,)),  # episode 1 answered in round 0
        TurnStep(caller, rollout, 2, (0,)),
    ]
    assert second.calls[0][2].turn == TurnStep(caller, second.calls[0][2].turn.rollout, 0)  # type: ignore[union-attr]
    assert second.calls[0][2].turn.rollout != rollout  # type: ignore[union-attr]
    assert all(s.turn is None for _, _, s in run(False).calls)
    # besides its name, each round asks exactly what it asked without it
    for (p1, n1, s1), (p2, n2, s2) in zip(first.calls, run(False).calls, strict=True):
        assert (p1, n1) == (p2, n2) and s1.__class__(**{**vars(s1), "turn": None}) == s2


@pytest.mark.parametrize("reuse", [None, True, False])
def test_an_agent_request_asks_for_reuse_unless_its_domain_turns_it_off(
    tokenizer: PreTrainedTokenizerBase, reuse: bool | None
) -> None:
    """The setting travels with the request's reward config: the embedded run, the rollout
    workers, the learner's evals and distillation all read it from the same domain config."""
    problems = [store_problem("a", {"plum": 3}, ["plum"], "3")]
    config: dict[str, Any] = {"kind": "agent"} | ({} if reuse is None else {"reuse_kv": reuse})
    setup = turn_setup(problems, config)
    assert setup is not None and setup.keep_kv == (reuse is not False)
    prompts = encode_prompts(tokenizer, ChatConfig(), [p.prompt for p in problems], False)
    engine = ScriptedEngine(tokenizer, prompts, [[call("kv_get", key="plum"), "3"]])
    request = PromptRequest(
        batch=0,
        index=0,
        domain="agent",
        policy_version=0,
        seed=11,
        group_size=1,
        max_tokens=400,
        temperature=1.0,
        top_p=1.0,
        overlong="none",
        problems=[problem_fields(p) for p in problems],
        prompt_ids=prompts,
        sample_ids=[["b0/a/0"]],
        reward_config=config,
    )
    generate_and_score(
        request,
        generate_fn=engine,
        decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
        score=lambda d, ps, texts, cfg: AgentDomain().score_batch(ps, texts),
        worker="t",
        encode=token_encoder(tokenizer),
    )
    rounds = [s.turn.round if s.turn is not None else None for _, _, s in engine.calls]
    assert rounds == ([None, None] if reuse is False else [0, 1])

"""The multi-turn loop (`cascade.tools.turn_loop`) on a scripted engine and the tiny tokenizer:
calls run and answered, responses appended as ids (never re-tokenised), the layout and the
scattered log-probs, every stop condition, malformed calls answered, tool text kept literal;
and the transcripts it makes are what the agent verifier replays and pays."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripted_turns import LP, ScriptedEngine, call, store_problem
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cascade.config import ChatConfig
from cascade.domains.agent import AgentDomain, prompt_tools
from cascade.domains.base import Problem
from cascade.engine.base import SamplingSettings
from cascade.model.chat import encode_prompts, token_encoder
from cascade.tools.environment import ToolEnvironment
from cascade.tools.turn_loop import MAX_TURNS, TurnRollout, env_ids, run_turns


@pytest.fixture(scope="module")
def tokenizer(random_tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(random_tiny_model))


def rollout(
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    scripts: list[list[str]],
    *,
    n: int = 1,
    budget: int = 400,
    max_turns: int = 8,
    envs: list[ToolEnvironment | None] | None = None,
) -> tuple[TurnRollout, ScriptedEngine, list[list[int]]]:
    domain = AgentDomain()
    prompts = encode_prompts(tokenizer, ChatConfig(), [p.prompt for p in problems], False)
    engine = ScriptedEngine(tokenizer, prompts, scripts)
    out = run_turns(
        prompts,
        n,
        SamplingSettings(max_tokens=budget, temperature=1.0, seed=7),
        generate_fn=engine,
        decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
        encode=token_encoder(tokenizer),
        environments=envs
        if envs is not None
        else [domain.environment(p) for p in problems for _ in range(n)],
        fmt=domain.format,
        thinking=False,
        max_turns=max_turns,
        round_seed=lambda r: 1000 + r,
    )
    return out, engine, prompts


def test_calls_run_responses_appended_and_the_verifier_pays(tokenizer: PreTrainedTokenizerBase) -> None:
    p = store_problem("a", {"plum": 3, "fig": 4}, ["plum", "fig"], "7")
    script = [
        call("kv_get", key="plum") + "\n" + call("kv_get", key="fig"),
        call("calc", expression="3+4"),
        "7",
    ]
    out, engine, prompts = rollout(tokenizer, [p], [script])
    assert out.rounds == 3 and out.finish_reasons == ["stop"]
    # rounds: the request itself (n, its seed), then each live episode's whole context, n = 1
    assert [(n, s.seed) for _, n, s in engine.calls] == [(1, 7), (1, 1001), (1, 1002)]
    layout = out.layouts[0]
    assert [m for _, m in layout.runs] == [True, False, True, False, True]
    assert layout.length == len(out.completion_ids[0])
    # the second round's context is the prompt and the ids so far, exactly (nothing re-tokenised)
    first_two = layout.runs[0][0] + layout.runs[1][0]
    assert engine.calls[1][0][0] == prompts[0] + out.completion_ids[0][:first_two]
    # the engine's log-probs at the model's tokens, 0.0 at the environment's
    assert out.logprobs[0] == [LP if m else 0.0 for m in layout.model_mask()]
    env_text = tokenizer.decode(out.completion_ids[0][layout.runs[0][0] : first_two])
    assert "<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response>" in env_text
    assert env_text.startswith("\n<|im_start|>user")  # the model's <|im_end|> is the model's
    assert out.stats[0].calls == 3 and out.stats[0].turns == 3
    verdict = AgentDomain().score_batch([p], out.texts)[0]
    assert (verdict.reward, verdict.reason) == (1.0, "ok"), verdict


def test_malformed_calls_get_an_error_response_and_count(tokenizer: PreTrainedTokenizerBase) -> None:
    p = store_problem("b", {"plum": 3}, ["plum"], "3")
    bad = "<tool_call>\n{not json\n</tool_call>" + call("nope") + call("kv_get", key=5)
    out, _, _ = rollout(tokenizer, [p], [[bad, call("kv_get", key="plum"), "3"]], budget=2000)
    assert out.finish_reasons == ["stop"] and out.rounds == 3
    malformed = out.stats[0].malformed
    assert (malformed["bad_json"], malformed["unknown_tool"], malformed["bad_arguments"]) == (1, 1, 1)
    text = out.texts[0]
    assert "error: bad_json" in text and "error: unknown_tool" in text and "error: bad_arguments" in text
    assert AgentDomain().score_batch([p], out.texts)[0].reward == 1.0


def test_max_turns_stops_an_episode_that_keeps_calling(tokenizer: PreTrainedTokenizerBase) -> None:
    p = store_problem("c", {"plum": 3}, ["plum"], "3")
    looping = [call("kv_get", key="plum")] * 5
    out, engine, _ = rollout(tokenizer, [p], [looping], max_turns=2)
    assert out.finish_reasons == [MAX_TURNS] and len(engine.calls) == 2
    assert [m for _, m in out.layouts[0].runs] == [True, False, True]  # ends with the model's turn
    assert AgentDomain().score_batch([p], out.texts)[0].reason == "no_answer"


def test_token_budget_counts_environment_tokens_and_cuts_per_episode(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    long_p = store_problem("d", {"plum": 3}, ["plum"], "3")
    short_p = store_problem("e", {"plum": 3}, ["plum"], "3")
    first = call("kv_get", key="plum")
    n_first = len(tokenizer(first, add_special_tokens=False)["input_ids"]) + 1
    probe, _, _ = rollout(tokenizer, [long_p], [[first, "3"]])
    n_env = probe.layouts[0].runs[1][0]
    # budget: room for the first turn and its responses plus 2 tokens: the answer "3<|im_end|>" fits,
    # a long answer is cut at the episode's own room (another episode in the round had more)
    budget = n_first + n_env + 2
    out, engine, _ = rollout(
        tokenizer, [long_p, short_p], [[first, "3"], [first, "3 is the value of plum"]], budget=budget
    )
    assert out.finish_reasons == ["stop", "length"]
    assert all(len(ids) <= budget for ids in out.completion_ids)
    assert len(out.completion_ids[1]) == budget
    assert engine.calls[1][2].max_tokens == 2
    # the environment's text that would leave no room for a turn is not appended
    tight, _, _ = rollout(tokenizer, [long_p], [[first, "3"]], budget=n_first + n_env)
    assert tight.finish_reasons == ["length"] and [m for _, m in tight.layouts[0].runs] == [True]
    # a turn cut by the budget ends its episode
    cut, _, _ = rollout(tokenizer, [long_p], [[first, "3"]], budget=3)
    assert cut.finish_reasons == ["length"] and len(cut.completion_ids[0]) == 3
    assert cut.stats[0].turns == 1  # a model turn, though the environment never read it


def test_groups_and_one_turn_problems(tokenizer: PreTrainedTokenizerBase) -> None:
    p = store_problem("f", {"plum": 3}, ["plum"], "3")
    out, engine, _ = rollout(tokenizer, [p], [[call("kv_get", key="plum"), "3"]], n=3)
    assert engine.calls[0][1] == 3 and len(engine.calls[1][0]) == 3  # G, then one per live episode
    assert out.finish_reasons == ["stop"] * 3 and len(set(map(tuple, out.completion_ids))) == 1
    assert out.version == 1  # the oldest weights that made any token
    single, engine, _ = rollout(tokenizer, [p], [[call("kv_get", key="plum")]], envs=[None])
    assert len(engine.calls) == 1 and single.layouts[0].runs == ((single.layouts[0].length, True),)


def test_tool_text_is_literal_never_a_special_token(tokenizer: PreTrainedTokenizerBase) -> None:
    fmt = AgentDomain().format
    encode = token_encoder(tokenizer)
    im_end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    ids, text = env_ids(fmt, ["a<|im_end|>b"], False, encode, [5, im_end])
    assert ids.count(im_end) == 1  # the tool turn's own end; the echoed one stays characters
    assert tokenizer.decode(ids) == text.removeprefix("<|im_end|>")
    # after a turn that did not end with its end-of-turn token, the turn end is the environment's
    ids2, _ = env_ids(fmt, ["1"], False, encode, [5])
    assert ids2[0] == im_end


def test_agent_prompts_render_their_tools(tokenizer: PreTrainedTokenizerBase) -> None:
    p = store_problem("g", {"plum": 3}, ["plum"], "3")
    tools = prompt_tools(p)
    assert tools is not None and [t["function"]["name"] for t in tools] == ["kv_get", "kv_set", "calc"]
    (ids,) = encode_prompts(tokenizer, ChatConfig(), [p.prompt], False, [tools])
    assert "Tools: kv_get kv_set calc" in tokenizer.decode(ids)

"""The `agent` model spec: its tokenizer keeps the template's tool markers as one token each (as
Qwen3's does), a reference trace fits its positions, and the SFT target of a trace is token for
token what the turn loop lays out for the same episode (the model's tokens trained, the
environment's not). The demo's `tiny` spec is untouched."""

from __future__ import annotations

import dataclasses

import pytest
from scripted_turns import ScriptedEngine
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cascade.bootstrap.policy import AGENT_SPEC, SPECS, TinyModelSpec, _sft_split, init_tokenizer_and_model
from cascade.bootstrap.sft_traces import tool_markers, trace_completion
from cascade.config import ChatConfig
from cascade.domains.agent import AgentDomain, default_format, prompt_tools, render_trace, trace_turns
from cascade.domains.base import Problem
from cascade.engine.base import SamplingSettings
from cascade.model.chat import encode_prompts, token_encoder
from cascade.tools.turn_loop import run_turns

SMALL = dataclasses.replace(AGENT_SPEC, sft_problems_per_domain=300, val_problems_per_domain=4)


@pytest.fixture(scope="module")
def agent_sft(tmp_path_factory: pytest.TempPathFactory) -> tuple[PreTrainedTokenizerBase, list[Problem]]:
    _, sft, _ = _sft_split(SMALL)
    tokenizer, _ = init_tokenizer_and_model(SMALL, sft)
    out = tmp_path_factory.mktemp("agent-tok")
    tokenizer.save_pretrained(out)
    return AutoTokenizer.from_pretrained(str(out)), sft["agent"]


def test_tiny_spec_is_the_demos() -> None:
    assert SPECS["tiny"] == TinyModelSpec() and not SPECS["tiny"].tool_tokens
    assert SPECS["agent"].domains == ("math", "code", "agent") and SPECS["agent"].tool_tokens


def test_tool_markers_are_read_off_the_template() -> None:
    assert tool_markers(default_format()) == (
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    )


def test_markers_are_single_tokens_and_survive_decoding(
    agent_sft: tuple[PreTrainedTokenizerBase, list[Problem]],
) -> None:
    tok, _ = agent_sft
    for marker in tool_markers(default_format()):
        ids = tok(marker, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, marker
        # not special: the turn loop decodes with skip_special_tokens and must still see the calls
        assert tok.decode(ids, skip_special_tokens=True) == marker


def test_every_sft_trace_fits_the_positions(agent_sft: tuple[PreTrainedTokenizerBase, list[Problem]]) -> None:
    tok, problems = agent_sft
    fmt, encode = default_format(), token_encoder(tok)
    longest = 0
    for p in problems:
        prompt = encode_prompts(tok, ChatConfig(), [p.prompt], False, [prompt_tools(p)])[0]
        ids, _ = trace_completion(p, fmt, encode, tok.eos_token_id, False)
        longest = max(longest, len(prompt) + len(ids))
    assert longest <= AGENT_SPEC.max_positions // 2, longest  # room to spare for RL's wrong turns
    assert longest <= AGENT_SPEC.eval_max_new_tokens + 64


def test_sft_target_is_the_turn_loops_layout(
    agent_sft: tuple[PreTrainedTokenizerBase, list[Problem]],
) -> None:
    tok, problems = agent_sft
    picked = {p.prompt.split("] ")[1].split()[0]: p for p in problems}  # a "What" and a "Set" task
    chosen = list(picked.values())
    domain = AgentDomain()
    prompts = encode_prompts(
        tok, ChatConfig(), [p.prompt for p in chosen], False, [prompt_tools(p) for p in chosen]
    )
    scripts = [[text for text, _ in trace_turns(p.meta["trace"], domain.format)] for p in chosen]
    out = run_turns(
        prompts,
        1,
        SamplingSettings(max_tokens=AGENT_SPEC.eval_max_new_tokens, greedy=True),
        generate_fn=ScriptedEngine(tok, prompts, scripts),
        decode=lambda ids: tok.batch_decode(ids, skip_special_tokens=True),
        encode=token_encoder(tok),
        environments=[domain.environment(p) for p in chosen],
        fmt=domain.format,
        thinking=False,
        max_turns=8,
        round_seed=lambda r: None,
    )
    for i, p in enumerate(chosen):
        ids, trained = trace_completion(p, domain.format, token_encoder(tok), tok.eos_token_id, False)
        assert out.completion_ids[i] == ids
        assert out.layouts[i].model_mask() == trained
        assert out.texts[i].startswith(render_trace(p.meta["trace"], domain.format))
        assert domain.score_batch([p], [out.texts[i]])[0].reward == 1.0
    assert not all(trained)  # the tool responses are not trained

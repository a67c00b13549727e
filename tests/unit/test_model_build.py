"""`cascade model init` builds a real HF checkpoint (safetensors + tokenizer) from nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.config import ChatConfig
from cascade.model.build import TinyModelSpec, build_tiny_model
from cascade.model.chat import render_prompt
from cascade.model.loading import ModelLoadError, load_policy


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, torch_one_thread: None) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    spec = TinyModelSpec(
        max_steps=12,
        eval_every=6,
        min_steps=6,
        sft_problems_per_domain=200,
        val_problems_per_domain=8,
        batch_size=8,
    )
    build_tiny_model(out, spec, log=lambda _: None)
    return out


def test_saves_safetensors_and_tokenizer(built: Path) -> None:
    assert (built / "model.safetensors").exists()
    assert (built / "tokenizer.json").exists()
    assert not list(built.glob("*.bin")), "weights must be safetensors, not pickles"
    log = json.loads((built / "sft_log.json").read_text())
    assert log["steps"] == 12 and log["stopped_by"] == "max_steps"
    assert set(log["final_scores"]) == {"math", "code", "if"}
    assert [h["step"] for h in log["history"]] == [6, 12]


def test_loads_through_auto_classes_with_chat_template(built: Path) -> None:
    policy = load_policy(built)
    assert type(policy.model).__name__ == "Qwen3ForCausalLM"
    text = render_prompt(policy.tokenizer, ChatConfig(), "What is 2+3?", thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "What is 2+3? /no_think" in text
    thinking = render_prompt(policy.tokenizer, ChatConfig(), "What is 2+3?", thinking=True)
    assert thinking.endswith("<|im_start|>assistant\n") and "/think" in thinking
    assert policy.eos_token_ids == [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_tokenizer_splits_digits_and_round_trips(built: Path) -> None:
    tok = load_policy(built).tokenizer
    ids = tok("12345", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5
    text = "def f(x):\n    return x*x+3"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_not_a_model_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_policy(tmp_path)

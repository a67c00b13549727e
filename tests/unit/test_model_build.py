"""`cascade model init` builds a real HF checkpoint (safetensors + tokenizer) from nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.bootstrap.policy import TinyModelSpec, build_tiny_model
from cascade.config import ChatConfig
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


# --------------------------------------------------------------------------- the five-domain spec


def test_default_spec_unchanged_and_full_spec_in_paper_order() -> None:
    from cascade.bootstrap.policy import FULL_SPEC, SPECS

    assert SPECS["tiny"] == TinyModelSpec()
    tiny = TinyModelSpec()
    assert tiny.domains == ("math", "code", "if") and not tiny.batch_by_domain
    assert [tiny.floor_of(d) for d in tiny.domains] == [0.2, 0.2, 0.2]
    assert tiny.sft_count("code") == 3000 and tiny.batch_size_of("if") == 48
    assert SPECS["full"] is FULL_SPEC
    assert FULL_SPEC.domains == ("rlhf", "if", "math", "code", "swe")
    assert FULL_SPEC.sft_count("rlhf") + FULL_SPEC.val_problems_per_domain <= 220  # the generator's space
    assert FULL_SPEC.batch_size_of("swe") < FULL_SPEC.batch_size_of("math")


def test_sft_learning_rate_warms_up_then_is_constant_or_cosine_decayed() -> None:
    from cascade.bootstrap.policy import sft_learning_rate

    constant = TinyModelSpec(learning_rate=1e-3, warmup_steps=10, max_steps=110)
    assert sft_learning_rate(constant, 5) == pytest.approx(5e-4)
    assert sft_learning_rate(constant, 60) == pytest.approx(1e-3)
    assert sft_learning_rate(constant, 110) == pytest.approx(1e-3)
    decayed = TinyModelSpec(learning_rate=1e-3, warmup_steps=10, max_steps=110, decay_to=0.1)
    assert sft_learning_rate(decayed, 5) == pytest.approx(5e-4)
    assert sft_learning_rate(decayed, 10) == pytest.approx(1e-3)
    # halfway through the decay: cos(pi/2) = 0, so 0.1 + 0.9 * 0.5 of the peak
    assert sft_learning_rate(decayed, 60) == pytest.approx(5.5e-4)
    assert sft_learning_rate(decayed, 110) == pytest.approx(1e-4)


def test_per_domain_fields_must_match_domains() -> None:
    with pytest.raises(ValueError, match="floors has 2 entries for 3 domains"):
        TinyModelSpec(floors=(0.1, 0.2))
    with pytest.raises(ValueError, match="batch_sizes"):
        TinyModelSpec(batch_sizes=(1,))


def test_rlhf_needs_a_reward_model() -> None:
    from cascade.bootstrap.policy import sft_domain_config

    with pytest.raises(ValueError, match="reward model"):
        sft_domain_config("rlhf")
    assert sft_domain_config("swe").name == "swe"


def test_cli_accepts_the_full_spec() -> None:
    from cascade.cli.main import build_parser

    args = build_parser().parse_args(["model", "init", "--spec", "full", "--out", "x"])
    assert args.spec == "full"
    assert build_parser().parse_args(["model", "init"]).spec == "tiny"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["model", "init", "--spec", "huge"])


@pytest.fixture(scope="module")
def built_five(tmp_path_factory: pytest.TempPathFactory, torch_one_thread: None) -> Path:
    """Five domains, one domain per batch, per-domain floors low enough to stop at the first check."""
    from cascade.bootstrap.policy import FULL_DOMAINS
    from cascade.bootstrap.reward_model import build_tiny_reward_model

    root = tmp_path_factory.mktemp("five")
    build_tiny_reward_model(root / "rm", steps=5, log=lambda _: None)
    spec = TinyModelSpec(
        vocab_size=512,
        max_positions=384,
        domains=FULL_DOMAINS,
        mix=(1.0,) * 5,
        floors=(0.0, 0.0, 0.0, 0.0, -1.0),
        sft_problems=(40, 40, 40, 40, 40),
        val_problems_per_domain=4,
        batch_by_domain=True,
        batch_sizes=(4, 4, 4, 4, 2),
        eval_max_new_tokens=8,
        max_steps=8,
        eval_every=2,
        min_steps=4,
    )
    build_tiny_model(root / "model", spec, log=lambda _: None, reward_model=root / "rm")
    return root / "model"


def test_five_domain_build_stops_by_per_domain_floors(built_five: Path) -> None:
    log = json.loads((built_five / "sft_log.json").read_text())
    assert log["stopped_by"] == "every domain >= its floor"
    assert log["steps"] == 4  # the first check at or after min_steps
    assert list(log["final_scores"]) == ["rlhf", "if", "math", "code", "swe"]
    assert -1.0 <= log["final_scores"]["swe"] <= 1.0
    assert 0.0 <= log["final_scores"]["rlhf"] <= 1.0  # win probability against the reference
    assert load_policy(built_five).tokenizer.vocab_size <= 512

"""The agent domain's eval metrics: task success with its Wilson interval (the score), calls per
task and the tool-error rate with bootstrap intervals over tasks, from the replayed episodes."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from scripted_turns import ScriptedEngine, call, store_problem
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cascade.config import ChatConfig, DomainConfig
from cascade.domains import make_domain
from cascade.domains.agent import prompt_tools
from cascade.eval.evaluate import evaluate_domain, tool_use_metrics
from cascade.eval.stats import ratio_interval, wilson_interval
from cascade.model.chat import encode_prompts
from cascade.tools.environment import EpisodeStats


@pytest.fixture(scope="module")
def tokenizer(random_tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(random_tiny_model))


def test_tool_use_metrics_hand_values() -> None:
    episodes = [
        EpisodeStats(turns=2, calls=2, ok=2),
        EpisodeStats(turns=3, calls=3, ok=2, tool_errors=1, malformed=Counter({"bad_json": 1})),
        EpisodeStats(turns=1),
    ]
    m = tool_use_metrics(episodes, seed=0, level=0.95)
    assert m["calls_per_task"].value == pytest.approx(5 / 3)
    assert m["calls_per_task"].n == 3 and m["calls_per_task"].method == "bootstrap"
    assert m["calls_per_task"].low <= 5 / 3 <= m["calls_per_task"].high
    # one failed call out of six attempts (five that ran, one malformed)
    assert m["tool_error_rate"].value == pytest.approx(1 / 6)
    assert 0.0 <= m["tool_error_rate"].low <= 1 / 6 <= m["tool_error_rate"].high <= 1.0
    none = tool_use_metrics([EpisodeStats(turns=1)], seed=0, level=0.95)
    assert none["tool_error_rate"].value == 0.0 and none["calls_per_task"].value == 0.0


def test_ratio_interval_pools_over_units() -> None:
    num, den = [0.0, 1.0, 0.0, 3.0], [2.0, 2.0, 1.0, 3.0]
    low, high = ratio_interval(num, den, seed=7)
    assert (low, high) == ratio_interval(num, den, seed=7)
    assert low <= 4 / 8 <= high
    assert ratio_interval([1.0, 2.0], [2.0, 4.0], seed=0) == pytest.approx((0.5, 0.5))
    assert all(math.isnan(v) for v in ratio_interval([0.0], [0.0], seed=0))
    with pytest.raises(ValueError, match="numerators"):
        ratio_interval([1.0], [1.0, 2.0], seed=0)


def test_evaluate_agent_reports_success_calls_and_errors(tokenizer: PreTrainedTokenizerBase) -> None:
    store = {"plum": 4, "fig": 7}
    right = store_problem("a", store, ["plum"], "4")
    wrong = store_problem("b", store, ["fig"], "7")
    problems = [right, wrong]
    chat = ChatConfig()
    tools = [prompt_tools(p) for p in problems]
    prompts = encode_prompts(tokenizer, chat, [p.prompt for p in problems], False, tools)
    engine = ScriptedEngine(
        tokenizer,
        prompts,
        [
            [call("kv_get", key="plum"), "4"],
            # a key the store does not hold: the tool answers an error; then a guess
            [call("kv_get", key="pear"), call("kv_get", key="fig"), "8"],
        ],
    )
    # as the runner has it: make_domain wraps the verifier (LengthBounded); still multi-turn
    domain = make_domain(DomainConfig(name="agent"))
    result = evaluate_domain(engine, tokenizer, chat, domain, problems, max_new_tokens=400)
    assert result.score == 0.5 and result.n == 2
    greedy = result.metrics["greedy"]
    assert greedy.method == "wilson" and (greedy.low, greedy.high) == pytest.approx(wilson_interval(1, 2))
    assert result.metrics["calls_per_task"].value == pytest.approx(3 / 2)
    assert result.metrics["tool_error_rate"].value == pytest.approx(1 / 3)
    assert result.reasons == {"ok": 1, "wrong_answer": 1}

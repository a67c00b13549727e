"""Issue 33, agent: one model turn that spells out the environment's reply (a forged tool response
in the template's format) and then `</think>` runs no call live, but a replay of the transcript's
text cuts it at the forged reply and credits the call.

The live loop (`cascade.tools.turn_loop._take_turn`) steps the whole decoded turn:
`ToolEnvironment.step` strips the reasoning first, and everything before the turn's last
`</think>` is reasoning, so the call is not one. The transcript's text is ambiguous (it also
reads as two turns), so the verifier is handed the loop's record (`TurnRollout.records`: the
model turns as they were stepped) and judges that episode (`cascade.tools.episode.replay_turns`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cascade.domains.agent import AgentDomain, default_format
from cascade.domains.base import Problem
from cascade.engine.base import Generation, SamplingSettings, VersionedGeneration
from cascade.tools.episode import read_record
from cascade.tools.template import ToolCallText
from cascade.tools.turn_loop import TurnRollout, run_turns

FMT = default_format()


@pytest.fixture(scope="module")
def tokenizer(random_tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(random_tiny_model))


def _one_read_problem() -> Problem:
    problems = AgentDomain().make_problems("eval", 40, seed=0)
    return next(p for p in problems if "answer" in p.meta["check"] and len(p.meta["reads"]) == 1)


def _call(problem: Problem) -> str:
    return FMT.render_calls([ToolCallText("kv_get", {"key": problem.meta["reads"][0]})])


def _value(problem: Problem) -> str:
    return str(problem.meta["store"][problem.meta["reads"][0]])


def _forged_single_turn(problem: Problem, thinking: bool) -> str:
    return _call(problem) + FMT.env_text([_value(problem)], thinking) + "</think>" + _value(problem)


class TurnScript:
    """A `GenerateFn` whose one episode writes `turns[t]` at round t, each ended by the
    end-of-turn token; the text is encoded piece by piece (`split_special_tokens`), as a policy
    writes markers it spells out rather than samples."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, turns: list[str]) -> None:
        self.tok, self.turns, self.round = tokenizer, turns, 0
        self.eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))

    def __call__(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        text = self.turns[self.round]
        self.round += 1
        row = list(self.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        row.append(self.eos)
        return VersionedGeneration(Generation([row], [[-0.5] * len(row)], ["stop"]), version=0, n=1)


def _live(
    tokenizer: PreTrainedTokenizerBase, problem: Problem, turns: list[str], thinking: bool
) -> TurnRollout:
    from cascade.model.chat import completion_decoder, token_encoder

    return run_turns(
        [[1, 2, 3]],
        1,
        SamplingSettings(max_tokens=600),
        generate_fn=TurnScript(tokenizer, turns),
        decode=completion_decoder(tokenizer),
        encode=token_encoder(tokenizer),
        environments=[AgentDomain().environment(problem)],
        fmt=FMT,
        thinking=thinking,
        max_turns=4,
        round_seed=lambda r: None,
    )


@pytest.mark.parametrize("thinking", [True, False])
def test_the_live_loop_runs_no_call_for_the_forged_turn(thinking: bool) -> None:
    """What the live loop does with this turn: no call (it is all reasoning), so a final answer
    given without reading the key."""
    domain, problem = AgentDomain(), _one_read_problem()
    env = domain.environment(problem)
    assert env.step(_forged_single_turn(problem, thinking)).final
    assert env.stats.calls == 0


@pytest.mark.parametrize("thinking", [True, False])
def test_a_forged_tool_response_in_one_turn_earns_nothing(
    tokenizer: PreTrainedTokenizerBase, thinking: bool
) -> None:
    domain, problem = AgentDomain(), _one_read_problem()
    forged = _forged_single_turn(problem, thinking)
    out = _live(tokenizer, problem, [forged], thinking)
    assert out.stats[0].calls == 0 and read_record(out.records[0]) == [out.texts[0]]
    verdict = domain.score_batch([problem], out.records)[0]
    assert verdict.reward == 0.0, verdict
    # the text alone reads as an episode with a real read: why the record is what is scored
    assert domain.score_batch([problem], out.texts)[0].reward == 1.0


@pytest.mark.parametrize("thinking", [True, False])
def test_an_honest_episode_scored_from_its_record_is_paid(
    tokenizer: PreTrainedTokenizerBase, thinking: bool
) -> None:
    domain, problem = AgentDomain(), _one_read_problem()
    think = "<think>\nread it\n</think>\n\n" if thinking else ""
    out = _live(tokenizer, problem, [think + _call(problem), think + _value(problem)], thinking)
    assert out.stats[0].calls == 1
    assert domain.score_batch([problem], out.records)[0].reward == 1.0
    assert domain.score_batch([problem], out.texts)[0].reward == 1.0  # text replay agrees here


FORGERIES = st.lists(
    st.sampled_from(["call", "forged_reply", "think_close", "think_open", "value", "noise", "reply_prefix"]),
    min_size=1,
    max_size=8,
)


@settings(derandomize=True, max_examples=examples(60), deadline=None)
@given(pieces=FORGERIES, thinking=st.booleans())
def test_a_turn_whose_text_and_live_layout_disagree_never_earns_more_than_its_live_episode(
    pieces: list[str], thinking: bool
) -> None:
    """Any one turn assembled from calls, forged replies and reasoning markers: its record is
    judged as the live loop stepped it (one turn), never as the episode its text spells out."""
    domain, problem = AgentDomain(), _one_read_problem()
    parts = {
        "call": _call(problem),
        "forged_reply": FMT.env_text([_value(problem)], thinking),
        "think_close": "</think>",
        "think_open": "<think>",
        "value": _value(problem),
        "noise": " ok ",
        "reply_prefix": FMT.turn_end + FMT.responses_prefix,
    }
    turn = "".join(parts[p] for p in pieces)
    from cascade.tools.episode import record_text

    # one live turn either made calls (and the episode ended there, unanswered) or answered
    # without reading the key: neither is paid, whatever the text spells out
    verdict = domain.score_batch([problem], [record_text([turn])])[0]
    assert verdict.reward == 0.0, (turn, verdict)

"""The SFT target of an agent problem, tokenised as the turn loop tokenises an episode.

A reference trace (`cascade.domains.agent`) becomes token pieces exactly as `run_turns` would
lay out a correct episode: each model turn encoded on its own and closed by the end-of-turn
token, the environment's text after it from `env_ids` (the same function the loop uses), so
the boundaries SFT trains on are the ones RL samples. Only the model's pieces are trained.
"""

from __future__ import annotations

from cascade.algo.turn_mask import TurnLayout
from cascade.domains.agent import trace_turns
from cascade.domains.base import Problem
from cascade.tools.template import ToolFormat
from cascade.tools.turn_loop import Encode, env_ids

EMPTY_THINK = "<think>\n\n</think>\n\n"
"""What a turn opens with when thinking is on (the tiny model's think block is empty)."""


def tool_markers(fmt: ToolFormat) -> tuple[str, ...]:
    """The template's tool markers (`<tool_call>`, `</tool_call>`, `<tool_response>`,
    `</tool_response>` for Qwen3's), read off the derived format."""
    turn_close = fmt.turn_end.strip()
    response_open = fmt.responses_prefix.strip().split()[-1]
    response_close = fmt.responses_suffix.strip().removesuffix(turn_close).strip()
    markers = (fmt.call_open, fmt.call_close, response_open, response_close)
    return tuple(dict.fromkeys(m for m in markers if m))


def trace_completion(
    problem: Problem, fmt: ToolFormat, encode: Encode, eos_id: int, thinking: bool
) -> tuple[list[int], list[bool]]:
    """The completion ids of `problem`'s reference trace and which of them are the model's."""
    turns = trace_turns(problem.meta["trace"], fmt)
    pieces: list[tuple[list[int], bool]] = []
    for i, (text, responses) in enumerate(turns):
        ids = encode((EMPTY_THINK if thinking else "") + text, False) + [eos_id]
        pieces.append((ids, True))
        if responses and i + 1 < len(turns):
            env, _ = env_ids(fmt, responses, thinking, encode, ids)
            pieces.append((env, False))
    layout, ids = TurnLayout.of_pieces(pieces)
    return ids, layout.model_mask()

"""Replaying a multi-turn transcript: the verifier trusts no tool response the text contains.

A transcript is what the turn loop produces after the prompt: model turn, then (if the turn made
calls) the environment's text `fmt.env_text(responses)` (the turn's end, the tool turn, the next
turn's opening), then the next model turn, ... up to a final turn without calls. `replay` cuts
the text at the first place an environment text could start, runs that turn's calls in a fresh
environment, and requires the text to continue with exactly the responses the environment gives.
So a response the model wrote itself (a forged `<tool_response>` claiming success) either is
exactly what the environment returns for calls the model really made, or breaks the replay.

A transcript's text alone is ambiguous: one model turn that spells out the environment's reply
in the template's format and then `</think>` reads as two turns with a call between them, while
the live loop stepped it as one turn that is all reasoning before its answer (no call ran). So
the turn loop hands the verifier its *record* (`record_text`: the model's turns as it stepped
them, JSON the model's text cannot break out of), and `replay_turns` steps exactly those turns in
a fresh environment, as the live loop did. Training, the eval and the reward service always
score records; `replay` of the text is for transcripts written by hand (tests, corpora).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from cascade.tools.environment import CallOutcome, StepResult, ToolEnvironment


@dataclass
class Episode:
    turns: list[str] = field(default_factory=list)
    """The model's turns, in order (the final one last when `final` is set)."""
    steps: list[StepResult] = field(default_factory=list)
    final: str | None = None
    """The last turn's text when it made no call (the episode's answer), else None."""
    broken: str | None = None
    """Why the text is not a transcript of this environment (a forged or altered response)."""

    @property
    def outcomes(self) -> list[CallOutcome]:
        return [o for step in self.steps for o in step.outcomes]


RECORD_KIND = "cascade-episode-record/1"


def record_text(turns: list[str]) -> str:
    """The live loop's record of an episode: its model turns, in order, as it stepped them."""
    return json.dumps({"kind": RECORD_KIND, "turns": turns})


def read_record(text: str) -> list[str] | None:
    """The model turns of a record (`record_text`), or None for a plain transcript."""
    if not text.startswith('{"kind": "' + RECORD_KIND):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    turns = data.get("turns") if isinstance(data, dict) else None
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        return None
    return turns


def replay_turns(turns: list[str], env: ToolEnvironment) -> Episode:
    """The episode the live loop ran: each recorded model turn stepped in order (the environment
    answers from its own state, so the responses are the environment's by construction); a turn
    the environment takes as final ends it, with that turn as the answer."""
    episode = Episode()
    for i, turn in enumerate(turns):
        step = env.step(turn)
        episode.turns.append(turn)
        episode.steps.append(step)
        if step.final:
            if i + 1 < len(turns):
                episode.broken = "the record goes on after a turn that made no call"
            else:
                episode.final = _without_turn_end(turn, env.fmt.turn_end)
            return episode
    return episode  # ended after calls (turn or token budget): no answer


def replay(text: str, env: ToolEnvironment) -> Episode:
    fmt = env.fmt
    boundary = fmt.turn_end + fmt.responses_prefix
    episode = Episode()
    at = 0
    while True:
        cut = text.find(boundary, at)
        turn = text[at:] if cut < 0 else text[at:cut]
        step = env.step(turn)
        episode.turns.append(turn)
        episode.steps.append(step)
        if step.final:
            if cut >= 0:
                episode.broken = "a tool response follows a turn that made no call"
            else:
                episode.final = _without_turn_end(turn, fmt.turn_end)
            return episode
        if cut < 0:
            return episode  # ended after calls (turn or token budget): no answer
        expected = fmt.turn_end + fmt.responses_prefix
        expected += fmt.response_separator.join(step.responses) + fmt.responses_suffix
        if not text.startswith(expected, cut):
            episode.broken = f"the tool responses after turn {len(episode.turns)} are not the environment's"
            return episode
        at = cut + len(expected)
        opening = next(
            (g for g in sorted(fmt.generation_prompts, key=len, reverse=True) if text.startswith(g, at)), None
        )
        if opening is None:
            episode.broken = f"no assistant turn opens after the tool responses of turn {len(episode.turns)}"
            return episode
        at += len(opening)


def _without_turn_end(turn: str, turn_end: str) -> str:
    """A final turn as the loop may keep it: with the model's end-of-turn marker, or without."""
    marker = turn_end.strip()
    stripped = turn.rstrip()
    return stripped[: -len(marker)] if marker and stripped.endswith(marker) else turn

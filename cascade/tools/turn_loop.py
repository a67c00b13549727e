"""The multi-turn rollout: generate a turn, run its tool calls, append the responses, go on.

Built only on a `GenerateFn` (the policy in this process or the rollout service), a decoder
and an encoder, so the embedded run and a rollout worker run this same loop
(`cascade.rollout.scoring.generate_and_score` calls it for the agent domain).

Each round is one batched generate over the live episodes: the first round is the request
itself (`n` completions of each prompt, with the request's seed, so its tokens are exactly a
single-turn request's), later rounds one completion of each live episode's whole context,
seeded `request_seed(seed, "turn", round)`. A turn stops at the model's end-of-turn token (an
EOS), which belongs to the model's span. The environment's text after a turn with calls (the
turn's end, the tool responses, the next turn's opening: `ToolFormat.env_text`) is encoded on
its own and appended as ids: the transcript is never re-tokenised, so the boundaries between
the model's and the environment's tokens are exact. Tool responses are encoded as literal text
(an echoed `<|im_end|>` stays characters, never the special token); the template's own markers
are encoded as the template means them.

An episode ends at a turn without calls (`stop`), a turn cut by the token budget (`length`),
`max_turns` model turns (`max_turns`), or when the environment's text would leave no token of
the budget for another turn (`length`; the text is then not appended). The budget counts every
completion token, the model's and the environment's.

The engine is asked for the whole context each round, and with `keep_kv` each request says
which round of which rollout it is (`TurnStep`: this loop's caller and a fresh rollout id, the
round, the episode each row continues). vLLM reuses the cached blocks of a context it has seen
either way (prefix caching). The HF engine, in both of its paths (the learner's `PolicyGenerate`
and the rollout service's `HFEngine`), keeps each round's keys/values and prefills only the
ids it has not processed in the next round (`cascade.engine.prefix_kv`): a decision made from
the request and the round alone, so the embedded and the distributed runs take the same ones
and stay equal on a seed. Round 0 is computed exactly as a single-turn request; later rounds
agree with a full prefill to float rounding.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from cascade.algo.turn_mask import TurnLayout
from cascade.engine.base import SamplingSettings, TurnStep, VersionedGeneration
from cascade.tools.builtin import ToolUnavailable
from cascade.tools.environment import MALFORMED_KINDS, EpisodeStats, ToolEnvironment, episode_metrics
from cascade.tools.episode import record_text
from cascade.tools.template import ToolFormat

GenerateFn = Callable[[list[list[int]], int, SamplingSettings], VersionedGeneration]
Decode = Callable[[list[list[int]]], list[str]]
Encode = Callable[[str, bool], list[int]]
"""`(text, literal) -> ids`: literal text never becomes a special token (tool output)."""
RoundSeed = Callable[[int], int | None]
"""The seed of round r >= 1 (round 0 uses the request's own)."""

MAX_TURNS = "max_turns"
TOOL_UNAVAILABLE = "tool_unavailable"


@dataclass
class _Episode:
    prompt: list[int]
    env: ToolEnvironment | None
    pieces: list[tuple[list[int], bool]] = field(default_factory=list)
    model_logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    turns: int = 0
    finish: str | None = None
    unavailable: str | None = None

    @property
    def n_tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.pieces)

    def context(self) -> list[int]:
        return self.prompt + [t for ids, _ in self.pieces for t in ids]


@dataclass
class TurnRollout:
    """Episodes prompt-major (row i belongs to prompt i // n), as a `Generation` is."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    """One per completion token: the engine's at the model's tokens, 0.0 at the environment's."""
    finish_reasons: list[str]
    texts: list[str]
    """The transcript: decoded model turns with the environment's text between them."""
    records: list[str]
    """What the verifier scores: the loop's record of each episode (`episode.record_text`, its
    model turns as the loop stepped them), never the transcript re-parsed."""
    layouts: list[TurnLayout]
    stats: list[EpisodeStats]
    version: int
    """The oldest weights that produced any token (what staleness must count)."""
    rounds: int
    unavailable: list[str | None]
    """Why a tool could not run (`ToolUnavailable`: the sandbox failed) in an episode it ended:
    the infrastructure's failure, to be scored `infra_error`, never a reward the model earned."""


def turn_metrics(episodes: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A batch's `turns/...` metrics from its episodes' counts (`EpisodeStats.as_metrics()`, as
    chunks carry them): means per episode, malformed-call and tool-error rates."""
    stats = [
        EpisodeStats(
            turns=int(e["turns"]),
            calls=int(e["calls"]),
            ok=int(e["calls_ok"]),
            tool_errors=int(e["tool_errors"]),
            malformed=Counter({k: int(e[f"malformed_{k}"]) for k in MALFORMED_KINDS}),
        )
        for e in episodes
    ]
    return {f"turns/{k}": v for k, v in episode_metrics(stats).items()}


def env_ids(
    fmt: ToolFormat, responses: Sequence[str], thinking: bool, encode: Encode, turn_ids: Sequence[int]
) -> tuple[list[int], str]:
    """The ids and text of the environment's answer to a turn that made calls.

    The template's turn end opens the text; when the model's last token is the turn end's first
    token (it stopped at its end-of-turn), that token stays the model's and is not repeated."""
    head = encode(fmt.turn_end + fmt.responses_prefix, False)
    if turn_ids and head and turn_ids[-1] == head[0]:
        head = head[1:]
    ids = list(head)
    for i, response in enumerate(responses):
        if i:
            ids += encode(fmt.response_separator, False)
        ids += encode(response, True)
    ids += encode(fmt.responses_suffix + fmt.generation_prompts[0 if thinking else 1], False)
    return ids, fmt.env_text(responses, thinking)


def turn_caller() -> str:
    """Who runs a turn loop (host, process, thread): an engine keeps one rollout per caller."""
    return f"{socket.gethostname()}/{os.getpid()}/{threading.get_ident()}"


def run_turns(
    prompts: list[list[int]],
    n: int,
    sampling: SamplingSettings,
    *,
    generate_fn: GenerateFn,
    decode: Decode,
    encode: Encode,
    environments: Sequence[ToolEnvironment | None],
    fmt: ToolFormat,
    thinking: bool,
    max_turns: int,
    round_seed: RoundSeed,
    keep_kv: bool = False,
) -> TurnRollout:
    """`n` episodes of each prompt; `environments[i]` serves episode i (None: one turn only).
    `keep_kv`: name each round (`TurnStep`) so the engine reuses the keys/values of the
    context it already processed (the agent domain's `reuse_kv`)."""
    if len(environments) != len(prompts) * n:
        raise ValueError(f"{len(environments)} environments for {len(prompts)} prompts x {n}")
    budget = sampling.max_tokens
    episodes = [_Episode(list(prompts[i // n]), env) for i, env in enumerate(environments)]
    rules = _Rules(budget, fmt, thinking, encode, decode, max_turns)
    name = (turn_caller(), uuid.uuid4().hex) if keep_kv else None
    versions: list[int] = []
    rounds = 0
    while True:
        live = [i for i, e in enumerate(episodes) if e.finish is None]
        if not live:
            break
        if rounds == 0:
            turn = None if name is None else TurnStep(*name, 0)
            result = generate_fn(prompts, n, replace(sampling, turn=turn))
        else:
            room = max(budget - episodes[i].n_tokens for i in live)
            settings = SamplingSettings(
                max_tokens=room,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                greedy=sampling.greedy,
                seed=round_seed(rounds),
                turn=None if name is None else TurnStep(*name, rounds, tuple(live)),
            )
            result = generate_fn([episodes[i].context() for i in live], 1, settings)
        versions.append(result.version)
        gen = result.generation
        texts = decode(gen.completion_ids)
        for i, ids, lps, reason, text in zip(
            live, gen.completion_ids, gen.logprobs, gen.finish_reasons, texts, strict=True
        ):
            _take_turn(episodes[i], list(ids), list(lps), reason, text, rules)
        rounds += 1
    layouts: list[TurnLayout] = []
    rows: list[list[int]] = []
    for e in episodes:
        layout, row = TurnLayout.of_pieces(e.pieces)
        layouts.append(layout)
        rows.append(row)
    return TurnRollout(
        completion_ids=rows,
        logprobs=[lay.scatter(e.model_logprobs) for lay, e in zip(layouts, episodes, strict=True)],
        finish_reasons=[e.finish or "stop" for e in episodes],
        texts=["".join(e.text) for e in episodes],
        records=[record_text(e.text[0::2]) for e in episodes],
        layouts=layouts,
        stats=[_model_turns(e) for e in episodes],
        version=min(versions),
        rounds=rounds,
        unavailable=[e.unavailable for e in episodes],
    )


def _model_turns(e: _Episode) -> EpisodeStats:
    """The episode's tool counts, with its model turns (a turn cut by the budget included)."""
    return replace(e.env.stats, turns=e.turns) if e.env is not None else EpisodeStats(turns=e.turns)


@dataclass(frozen=True)
class _Rules:
    budget: int
    fmt: ToolFormat
    thinking: bool
    encode: Encode
    decode: Decode
    max_turns: int


def _take_turn(
    e: _Episode, ids: list[int], logprobs: list[float], reason: str, text: str, rules: _Rules
) -> None:
    room = rules.budget - e.n_tokens
    if len(ids) > room:  # a batch round asks for the longest room; this episode had less
        ids, logprobs, reason = ids[:room], logprobs[:room], "length"
        text = rules.decode([ids])[0]
    e.pieces.append((ids, True))
    e.model_logprobs += logprobs
    e.text.append(text)
    e.turns += 1
    if reason != "stop" or e.env is None:
        e.finish = reason
        return
    try:
        step = e.env.step(text)
    except ToolUnavailable as err:
        e.finish, e.unavailable = TOOL_UNAVAILABLE, str(err)
        return
    if step.final:
        e.finish = "stop"
        return
    if e.turns >= rules.max_turns:
        e.finish = MAX_TURNS
        return
    appended, env_text = env_ids(rules.fmt, step.responses, rules.thinking, rules.encode, ids)
    if e.n_tokens + len(appended) >= rules.budget:
        e.finish = "length"
        return
    e.pieces.append((appended, False))
    e.text.append(env_text)

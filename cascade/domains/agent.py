"""Agent domain: tasks done by calling tools, rewarded by task completion.

Synthetic tasks run against a small key-value store whose contents the prompt does not show
(`[store 4821] What is plum + fig?`): the values must be read with `kv_get`, combined (by the
model or with `calc`), and either answered or written back with `kv_set` (`Set total to plum *
fig.`), which the checker reads from the environment's final state. A problem's meta holds the
store (drawn from the store's seed), the keys that must be read, what is checked, the tools
offered, and the reference trace (the messages of a correct episode: calls and responses), whose
rendering in the template's tool format is the problem's answer, for supervised tuning.

The completion is the multi-turn transcript after the prompt (`cascade.tools.episode`). The
verifier replays it in a fresh environment and trusts none of its tool responses. Paid 1 only
when all of these hold, else 0:
- the transcript is the environment's (no forged or altered response: `parse_error`);
- it ends in a final turn without calls (`no_answer` when it ends after calls);
- no loop: the episode stayed within `max_turns` turns and the call limit, and made no call
  more than `max_repeated_calls` times (`wrong_answer`);
- every needed key was read by a successful `kv_get` (an answer without the calls is not paid,
  even when right);
- the final answer copies no error response;
- answer tasks: the final answer (after the reasoning block) is exactly the integer;
- state tasks: the target key holds the value;
- no key changed that the task did not ask to set (answer tasks included).

Function-call problems (meta `task: function_call`, from the `bfcl` adapter) are one turn: the
calls in the response must match the expected calls structurally (`function_calls.match_calls`).
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

from cascade.config import AgentReward
from cascade.domains.base import INFRA_ERROR, NO_ANSWER, OK, PARSE_ERROR, WRONG_ANSWER, Problem, RewardVerdict
from cascade.domains.common import Candidate, generate_problems
from cascade.domains.function_calls import match_calls
from cascade.model.chat import strip_thinking
from cascade.sandbox.jobs import BwrapSettings, SandboxLimits, resolve_backend
from cascade.tools.builtin import PythonTool, ToolUnavailable
from cascade.tools.environment import (
    ERROR_PREFIX,
    EpisodeStats,
    ToolEnvironment,
    ToolLimits,
    call_spans,
    read_call,
)
from cascade.tools.episode import Episode, read_record, replay, replay_turns
from cascade.tools.template import (
    TOOL_CHAT_TEMPLATE,
    ToolCallText,
    ToolFormat,
    format_of_template,
    format_of_tokenizer,
)

KEYS = (
    "apple", "pear", "plum", "fig", "lime", "kiwi", "date", "mango",
    "peach", "grape", "melon", "lemon", "cherry", "olive", "guava", "berry",
)  # fmt: skip
TARGETS = ("total", "result", "out", "sum")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
STORE_KEYS = 4
TOOLS = ("kv_get", "kv_set", "calc")


def make_store(seed: int) -> dict[str, int]:
    """The store of `[store <seed>]`: `STORE_KEYS` keys with values 1..9, from the seed alone."""
    rng = Random(f"agent-store-{seed}")
    return {key: rng.randint(1, 9) for key in rng.sample(KEYS, STORE_KEYS)}


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def draw_agent_problem(rng: Random) -> Candidate:
    seed = rng.randrange(10_000)
    store = make_store(seed)
    keys = list(store)
    kind = rng.choice(("get", "op", "op", "set"))
    trace: list[dict[str, Any]] = []
    if kind == "get":
        key = rng.choice(keys)
        trace += [
            {"role": "assistant", "content": "", "tool_calls": [_call("kv_get", key=key)]},
            {"role": "tool", "content": str(store[key])},
            {"role": "assistant", "content": str(store[key])},
        ]
        meta = {"reads": [key], "check": {"answer": str(store[key])}}
        return _candidate(seed, f"What is {key}?", store, meta, trace)
    a, b = rng.sample(keys, 2)
    op = rng.choice(tuple(OPS))
    value = OPS[op](store[a], store[b])
    expression = f"{store[a]}{op}{store[b]}"
    trace += [
        {"role": "assistant", "content": "", "tool_calls": [_call("kv_get", key=a), _call("kv_get", key=b)]},
        {"role": "tool", "content": str(store[a])},
        {"role": "tool", "content": str(store[b])},
        {"role": "assistant", "content": "", "tool_calls": [_call("calc", expression=expression)]},
        {"role": "tool", "content": str(value)},
    ]
    if kind == "op":
        trace.append({"role": "assistant", "content": str(value)})
        meta = {"reads": [a, b], "check": {"answer": str(value)}}
        return _candidate(seed, f"What is {a} {op} {b}?", store, meta, trace)
    target = rng.choice(TARGETS)
    trace += [
        {"role": "assistant", "content": "", "tool_calls": [_call("kv_set", key=target, value=value)]},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "Done."},
    ]
    meta = {"reads": [a, b], "check": {"state": {target: value}}}
    return _candidate(seed, f"Set {target} to {a} {op} {b}.", store, meta, trace)


def _candidate(
    seed: int, question: str, store: dict[str, int], meta: dict[str, Any], trace: list[dict[str, Any]]
) -> Candidate:
    full = {"task": "store", "seed": seed, "store": store, "tools": list(TOOLS), **meta, "trace": trace}
    return f"[store {seed}] {question}", render_trace(trace, default_format()), full


def trace_turns(trace: Sequence[dict[str, Any]], fmt: ToolFormat) -> list[tuple[str, list[str]]]:
    """A reference trace as the turn loop meets it: each model turn's text (content and calls,
    without the end-of-turn marker) and the tool responses that answer it (none after the last)."""
    turns: list[tuple[str, list[str]]] = []
    for message in trace:
        if message["role"] == "tool":
            if turns:
                turns[-1][1].append(str(message["content"]))
            continue
        calls = [
            ToolCallText(c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls", [])
        ]
        content = str(message.get("content") or "")
        joiner = fmt.call_separator if content and calls else ""
        turns.append((content + joiner + fmt.render_calls(calls), []))
    return turns


def render_trace(trace: Sequence[dict[str, Any]], fmt: ToolFormat, thinking: bool = False) -> str:
    """A reference trace as the transcript the turn loop would produce (the SFT target)."""
    turns = trace_turns(trace, fmt)
    out: list[str] = []
    for i, (text, responses) in enumerate(turns):
        out.append(text)
        if responses and i + 1 < len(turns):
            out.append(fmt.env_text(responses, thinking))
    return "".join(out)


@functools.lru_cache(maxsize=8)
def _format_of(template: str) -> ToolFormat:
    return format_of_template(template)


def default_format() -> ToolFormat:
    return _format_of(TOOL_CHAT_TEMPLATE)


@functools.lru_cache(maxsize=8)
def _format_of_tokenizer_dir(path: Path) -> ToolFormat:
    from transformers import AutoTokenizer

    return format_of_tokenizer(AutoTokenizer.from_pretrained(str(path)))


_INTEGER = re.compile(r"-?\d+")


class AgentDomain:
    name = "agent"

    def __init__(self, config: AgentReward | None = None) -> None:
        self.config = config or AgentReward()
        self.format = (
            _format_of_tokenizer_dir(self.config.chat_template_from)
            if self.config.chat_template_from
            else default_format()
        )
        self.limits = ToolLimits(
            max_calls_per_turn=self.config.max_calls_per_turn,
            max_calls_per_episode=self.config.max_calls_per_episode,
            max_call_chars=self.config.max_call_chars,
        )
        self.python = (
            PythonTool(
                SandboxLimits(time_limit_s=self.config.time_limit_s, memory_mb=self.config.memory_mb),
                self.config.sandbox,
                BwrapSettings(uid=self.config.sandbox_uid),
            )
            if self.config.python_tool
            else None
        )

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return generate_problems(self.name, split, n, seed, draw_agent_problem)

    def prepare(self) -> None:
        """With the python tool: start the sandbox now (`SandboxUnavailable` says what is missing)."""
        if self.python is not None:
            resolve_backend(self.python.backend, 1, self.python.settings)

    def environment(self, problem: Problem) -> ToolEnvironment:
        """A fresh environment for `problem` (what the turn loop and the verifier both run)."""
        tools = list(problem.meta.get("tools", TOOLS))
        if self.python is not None and "python" not in tools:
            tools.append("python")
        store = {str(k): int(v) for k, v in dict(problem.meta.get("store", {})).items()}
        return ToolEnvironment(self.format, store, tools=tools, limits=self.limits, python=self.python)

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        return self.score_with_stats(problems, completions)[0]

    def score_with_stats(
        self, problems: Sequence[Problem], completions: Sequence[str]
    ) -> tuple[list[RewardVerdict], list[EpisodeStats]]:
        """Verdicts and each replayed episode's counts (the metrics' `episode_metrics`); empty
        counts for a function-call problem or one that could not be replayed."""
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        scored = [self._score_one(p, c) for p, c in zip(problems, completions, strict=True)]
        return [v for v, _ in scored], [s for _, s in scored]

    def _score_one(self, problem: Problem, completion: str) -> tuple[RewardVerdict, EpisodeStats]:
        task = problem.meta.get("task")
        if task == "function_call":
            return self._score_function_call(problem, completion), EpisodeStats()
        if task != "store":
            return RewardVerdict(
                0.0, INFRA_ERROR, f"problem {problem.id}: unknown agent task {task!r}"
            ), EpisodeStats()
        try:
            env = self.environment(problem)
        except (TypeError, ValueError) as err:
            return RewardVerdict(0.0, INFRA_ERROR, f"problem {problem.id}: {err}"), EpisodeStats()
        try:
            turns = read_record(completion)
            episode = replay(completion, env) if turns is None else replay_turns(turns, env)
        except ToolUnavailable as err:
            return RewardVerdict(0.0, INFRA_ERROR, str(err)), env.stats
        return self._judge(problem, episode, env), env.stats

    def _judge(self, problem: Problem, episode: Episode, env: ToolEnvironment) -> RewardVerdict:
        if episode.broken:
            return RewardVerdict(0.0, PARSE_ERROR, episode.broken)
        if len(episode.turns) > self.config.max_turns:
            return RewardVerdict(0.0, WRONG_ANSWER, f"more than {self.config.max_turns} turns")
        if env.stats.malformed["too_many_calls_episode"]:
            return RewardVerdict(
                0.0, WRONG_ANSWER, f"call limit reached ({self.limits.max_calls_per_episode})"
            )
        repeats = Counter(
            (o.call.name, json.dumps(o.call.arguments, sort_keys=True)) for o in episode.outcomes if o.call
        )
        looped = [name for (name, _), n in repeats.items() if n > self.config.max_repeated_calls]
        if looped:
            return RewardVerdict(0.0, WRONG_ANSWER, f"the same call repeated (a loop): {looped[0]}")
        if episode.final is None:
            return RewardVerdict(0.0, NO_ANSWER, "the episode ended after tool calls, without a final answer")
        answer = strip_thinking(episode.final)
        read = {
            o.call.arguments.get("key")
            for o in episode.outcomes
            if o.ok and o.call and o.call.name == "kv_get"
        }
        missing = [k for k in problem.meta.get("reads", []) if k not in read]
        if missing:
            return RewardVerdict(0.0, WRONG_ANSWER, f"answered without reading {missing}")
        errors = [o.response.removeprefix(ERROR_PREFIX).strip() for o in episode.outcomes if not o.ok]
        if ERROR_PREFIX.strip() in answer or any(e and e in answer for e in errors):
            return RewardVerdict(0.0, WRONG_ANSWER, "the answer copies a tool error")
        check = problem.meta.get("check", {})
        if "answer" not in check and "state" not in check:
            return RewardVerdict(0.0, INFRA_ERROR, f"problem {problem.id}: nothing to check")
        if "answer" in check:
            if not answer:
                return RewardVerdict(0.0, NO_ANSWER, "empty final answer")
            if not _INTEGER.fullmatch(answer) or int(answer) != int(check["answer"]):
                return RewardVerdict(0.0, WRONG_ANSWER, f"answered {answer[:40]!r}")
        return self._judge_state(problem, check.get("state", {}), env)

    @staticmethod
    def _judge_state(problem: Problem, want: dict[str, Any], env: ToolEnvironment) -> RewardVerdict:
        """The keys the task sets hold their values, and no other key changed (for every task:
        a side effect the task did not ask for is not paid)."""
        final = env.store.values
        for key, value in want.items():
            if final.get(key) != value:
                return RewardVerdict(
                    0.0, WRONG_ANSWER, f"{key} is {final.get(key)!r}, not set to the task's value"
                )
        initial = problem.meta.get("store", {})
        changed = sorted(
            k for k in set(initial) | set(final) if k not in want and initial.get(k) != final.get(k)
        )
        if changed:
            return RewardVerdict(0.0, WRONG_ANSWER, f"changed keys the task did not ask for: {changed}")
        return RewardVerdict(1.0, OK)

    def _score_function_call(self, problem: Problem, completion: str) -> RewardVerdict:
        response = strip_thinking(completion)
        calls: list[ToolCallText] = []
        for _, _, body in call_spans(response, self.format):
            read = read_call(body, self.format, self.config.max_call_chars)
            if not isinstance(read, ToolCallText):
                return RewardVerdict(0.0, PARSE_ERROR, f"{read[0]}: {read[1]}")
            calls.append(read)
        if not calls:
            return RewardVerdict(0.0, NO_ANSWER, "no function call in the response")
        expected, tools = problem.meta.get("expected_calls"), problem.meta.get("tools", [])
        if not isinstance(expected, list) or not expected:
            return RewardVerdict(0.0, INFRA_ERROR, f"problem {problem.id} has no expected calls")
        result = match_calls(calls, expected, tools)
        return RewardVerdict(1.0, OK) if result.ok else RewardVerdict(0.0, WRONG_ANSWER, result.why)


@dataclass(frozen=True)
class TurnSetup:
    """What the turn loop needs for one request's episodes (`cascade.rollout.scoring.generate_and_score`)."""

    format: ToolFormat
    environments: list[ToolEnvironment | None]
    """One per episode; None: a one-turn problem (a function-call row)."""
    max_turns: int
    keep_kv: bool = False
    """Reuse the engine's keys/values between rounds (`AgentReward.reuse_kv`)."""


@functools.lru_cache(maxsize=8)
def _domain_of(reward_json: str) -> AgentDomain:
    return AgentDomain(AgentReward.model_validate_json(reward_json))


def turn_setup(problems: Sequence[Problem], reward_config: dict[str, Any] | None) -> TurnSetup | None:
    """Fresh environments for the store tasks among `problems` (one per episode), built from the
    request's reward config as the verifier builds them; None when no problem is multi-turn."""
    domain = _domain_of(json.dumps(reward_config or {}, sort_keys=True))
    envs = [domain.environment(p) if p.meta.get("task") == "store" else None for p in problems]
    if not any(e is not None for e in envs):
        return None
    return TurnSetup(domain.format, envs, domain.config.max_turns, domain.config.reuse_kv)


def prompt_tools(problem: Problem) -> list[dict[str, Any]] | None:
    """The tools a problem's prompt renders (`tools=` of the chat template): the environment's
    schemas for a store task, the row's JSON schemas for a function-call task."""
    task = problem.meta.get("task")
    if task == "store":
        return AgentDomain().environment(problem).schemas
    tools = problem.meta.get("tools")
    if task == "function_call" and isinstance(tools, list) and all(isinstance(t, dict) for t in tools):
        return list(tools)
    return None

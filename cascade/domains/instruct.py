"""Instruction-following domain ("if"): restate given words under verifiable format rules.

A problem picks 2-4 topic words, a format (plain line, bullets, JSON object) and a case, builds
the reference response from them, then states 2-3 rules the reference satisfies (so every
reference is correct by construction), e.g. `Words: red fox sun. 3 bullets. All caps.` ->
`- RED\\n- FOX\\n- SUN`. The rule that fixes the format always comes first, then the case rule,
then extras (start/end word, include/avoid a word, no commas). Scoring checks each rule
(`cascade.domains.if_rules`): reward 1/0 when all hold (`all_pass`) or the share held.

The task itself, restating the words (`Words: red fox sun.`), is a rule too (`topic_words`,
first in meta, its sentence the prompt's first): a gate. A reply that does not restate them (a
bullet template, an empty JSON object, other words) earns 0 in either mode, whatever format
rules it follows; nor does a reply that echoes the prompt (`echoes_prompt`). Problems stored
before the gate existed have no such rule and are scored as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from random import Random

from cascade.config import IfReward
from cascade.domains.base import INFRA_ERROR, NO_ANSWER, OK, WRONG_ANSWER, Problem, RewardVerdict
from cascade.domains.common import Candidate, generate_problems
from cascade.domains.if_rules import (
    AllLowercase,
    AllUppercase,
    BulletCount,
    EndWith,
    ExcludeWord,
    IncludeWord,
    JsonKeys,
    NoCommas,
    Rule,
    StartWith,
    TopicWords,
    WordCount,
    rule_from_json,
)
from cascade.domains.if_rules import check_rules as strict_check
from cascade.domains.if_rules.core import is_blank
from cascade.model.chat import strip_thinking

VOCAB = (
    "red fox sun cat dog tree sky sea moon star rain wind leaf bird fish rock hill lake road door "
    "book lamp cup hat bell ship snow fire gold milk rose frog bee owl egg ice oak jam map pen"
).split()
_JSON_KEYS = ("words", "items", "list")


def draw_if_problem(rng: Random) -> Candidate:
    topic = rng.sample(VOCAB, rng.randint(2, 4))
    fmt = rng.choices(("plain", "bullets", "json"), weights=(4, 4, 2))[0]
    case = "lower" if fmt == "json" else rng.choice(("lower", "upper"))
    shown = [w.upper() for w in topic] if case == "upper" else list(topic)
    others = [w for w in VOCAB if w not in topic]

    rules: list[Rule] = []
    if fmt == "plain":
        answer = " ".join(shown)
        rules.append(WordCount(n=len(shown)))
    elif fmt == "bullets":
        answer = "\n".join(f"- {w}" for w in shown)
        rules.append(BulletCount(n=len(shown)))
    else:
        key = rng.choice(_JSON_KEYS)
        answer = json.dumps({key: shown}, separators=(",", ":"))
        rules.append(JsonKeys(keys=[key]))
    if case == "upper":
        rules.append(AllUppercase())
    elif rng.random() < 0.5:
        rules.append(AllLowercase())

    extras: list[Rule] = [IncludeWord(word=rng.choice(topic)), ExcludeWord(word=rng.choice(others))]
    if fmt != "json":
        extras += [StartWith(word=shown[0]), EndWith(word=shown[-1]), NoCommas()]
    target = rng.randint(2, 3)
    rng.shuffle(extras)
    rules += extras[: max(0, target - len(rules))]

    rules.insert(0, TopicWords(words=topic))
    prompt = " ".join(rule.describe() for rule in rules)  # "Words: red fox sun. 3 bullets. ..."
    meta = {"rules": [rule.to_json() for rule in rules], "format": fmt, "case": case}
    return prompt, answer, meta


def check_rules(rules: Sequence[Rule], response: str) -> list[str]:
    """Names of the rules `response` breaks (strictly; a blank response breaks every rule)."""
    held = strict_check(rules, response)
    return [rule.name for rule, ok in zip(rules, held, strict=True) if not ok]


def echoes_prompt(prompt: str, response: str) -> bool:
    """Whether `response` restates the whole prompt (case and whitespace runs aside). On a toy
    problem the prompt's own words pass the topic gate (`Words: sky milk. Start with sky. Use
    milk.` is mostly topic words) and some of its rules, so an echo would earn a share in
    `fraction` mode; no answer of a toy problem contains its prompt."""
    wanted = " ".join(prompt.split()).lower()
    return bool(wanted) and wanted in " ".join(response.split()).lower()


class IfDomain:
    """The instruction-following domain: problems plus rule checks."""

    name = "if"

    def __init__(self, config: IfReward | None = None) -> None:
        self.config = config or IfReward()

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return generate_problems(self.name, split, n, seed, draw_if_problem)

    def score(self, problem: Problem, completion: str) -> RewardVerdict:
        response = strip_thinking(completion)
        if is_blank(response):
            return RewardVerdict(0.0, NO_ANSWER, "empty response")
        try:
            rules = [rule_from_json(record) for record in problem.meta.get("rules", [])]
        except (ValueError, TypeError, KeyError) as err:
            return RewardVerdict(0.0, INFRA_ERROR, f"problem {problem.id}: bad rules: {err}")
        if not rules:
            return RewardVerdict(0.0, INFRA_ERROR, f"problem {problem.id} has no rules")
        if any(rule.gate for rule in rules) and echoes_prompt(problem.prompt, response):
            return RewardVerdict(0.0, WRONG_ANSWER, "off topic; echoes the prompt")
        failed = check_rules(rules, response)
        if not failed:
            return RewardVerdict(1.0, OK)
        gated = any(rule.gate and rule.name in failed for rule in rules)
        if gated or self.config.mode == "all_pass":
            reward = 0.0
        else:
            reward = 1.0 - len(failed) / len(rules)
        detail = ("off topic; " if gated else "") + "failed: " + ", ".join(failed)
        return RewardVerdict(reward, WRONG_ANSWER, detail)

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        return [self.score(p, c) for p, c in zip(problems, completions, strict=True)]

"""Reward domains: problems with reference answers, and the verifier that scores completions.

`make_domain` builds a domain from its config; `load_problems` gives a split's problems from
the configured source (the domain's own generator, or JSON-lines files); `write_jsonl` writes
problems in the format `load_problems` reads. Domain modules are imported on first use (math
pulls in sympy).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cascade.config import (
    AgentReward,
    CodeReward,
    DomainConfig,
    HfPrompts,
    IfReward,
    JsonlPrompts,
    MathReward,
    PythonReward,
    RlhfReward,
    SweReward,
    SyntheticPrompts,
)
from cascade.domains.base import Domain, Problem, RewardVerdict

__all__ = ["Domain", "Problem", "RewardVerdict", "load_problems", "make_domain", "read_jsonl", "write_jsonl"]

_JSONL_FIELDS = {"id", "prompt", "answer", "meta", "domain"}


def make_domain(domain_config: DomainConfig) -> Domain:
    """The domain named by the config, with its reward settings (defaults when `reward` is None),
    behind its response-length bound (`length_bound`: over-long answers are never read)."""
    from cascade.domains.length_bound import bounded

    reward = domain_config.reward_settings  # rlhf always names its reward (and is not bounded)
    return bounded(_make_verifier(domain_config), getattr(reward, "max_response_chars", None))


def _make_verifier(domain_config: DomainConfig) -> Domain:
    reward = domain_config.reward
    kind = domain_config.kind
    if kind == "python":
        from cascade.domains.custom import CustomDomain

        assert isinstance(reward, PythonReward), "validated by DomainConfig"
        return CustomDomain(reward)
    if kind == "math":
        from cascade.domains.math import MathDomain

        assert reward is None or isinstance(reward, MathReward)
        return MathDomain(reward or MathReward())
    if kind == "code":
        from cascade.domains.code import CodeDomain

        assert reward is None or isinstance(reward, CodeReward)
        return CodeDomain(reward or CodeReward())
    if kind == "if":
        from cascade.domains.instruct import IfDomain

        assert reward is None or isinstance(reward, IfReward)
        return IfDomain(reward or IfReward())
    if kind == "swe":
        from cascade.domains.swe import SweDomain

        assert reward is None or isinstance(reward, SweReward)
        return SweDomain.from_config(reward or SweReward())
    if kind == "rlhf":
        from cascade.domains.rm import RewardModelScorer, RlhfDomain

        assert isinstance(reward, RlhfReward), "validated by DomainConfig"
        scorer = RewardModelScorer(
            reward.model_path,
            batch_size=reward.batch_size,
            max_length=reward.max_length,
            shaping=reward.shaping,
        )
        return RlhfDomain(scorer, baseline=reward.baseline)
    if kind == "agent":
        from cascade.domains.agent import AgentDomain

        assert reward is None or isinstance(reward, AgentReward)
        return AgentDomain(reward or AgentReward())
    raise ValueError(f"unknown verifier {kind!r} of domain {domain_config.name!r}")


def load_problems(domain_config: DomainConfig, split: str) -> list[Problem]:
    """Problems of `split` ("train", "eval" or "sft") from the domain's configured source.

    Synthetic: `n_train` problems for "train" and "sft" (disjoint sets), `n_eval` for "eval".
    JSON lines: `train_path` for "train" and "sft" (no separate SFT file), `eval_path` for "eval".
    Hugging Face data set (`kind: hf`): see `cascade.domains.hf_source` ("sft" is "train").
    """
    if split not in ("train", "eval", "sft"):
        raise ValueError(f"unknown split {split!r}; expected 'train', 'eval' or 'sft'")
    source = domain_config.prompts
    if isinstance(source, SyntheticPrompts):
        n = source.n_eval if split == "eval" else source.n_train
        problems = make_domain(domain_config).make_problems(split, n, source.seed)
        if domain_config.name != domain_config.kind:  # `gsm8k` of kind math: its own problems' label
            problems = [dataclasses.replace(p, domain=domain_config.name) for p in problems]
        return problems
    if isinstance(source, JsonlPrompts):
        path = source.eval_path if split == "eval" else source.train_path
        return read_jsonl(path, domain_config.name)
    if isinstance(source, HfPrompts):
        from cascade.domains.hf_source import load_hf

        loaded = load_hf(source, domain_config.name)
        return loaded.eval if split == "eval" else loaded.train
    raise TypeError(f"unsupported prompt source {type(source).__name__}")


def read_jsonl(path: str | Path, domain: str) -> list[Problem]:
    """Problems from a JSON-lines file; a bad line raises ValueError naming the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err.strerror or err}") from None
    problems: list[Problem] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            problem = _problem_from_record(json.loads(line), domain)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: line {lineno}: {err}") from None
        if problem.id in seen:
            raise ValueError(f"{path}: line {lineno}: duplicate id {problem.id!r}")
        seen.add(problem.id)
        problems.append(problem)
    if not problems:
        raise ValueError(f"{path}: no problems in the file")
    return problems


def _problem_from_record(record: Any, domain: str) -> Problem:
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    unknown = set(record) - _JSONL_FIELDS
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}; expected {sorted(_JSONL_FIELDS)}")
    for name in ("id", "prompt", "answer"):
        if not isinstance(record.get(name), str):
            raise ValueError(f"field {name!r} must be a string, got {record.get(name)!r:.60}")
    meta = record.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError(f"field 'meta' must be an object, got {type(meta).__name__}")
    if record.get("domain", domain) != domain:
        raise ValueError(f"field 'domain' is {record['domain']!r}, expected {domain!r}")
    return Problem(
        id=record["id"], domain=domain, prompt=record["prompt"], answer=record["answer"], meta=meta
    )


def write_jsonl(problems: Iterable[Problem], path: str | Path) -> None:
    """Write problems as JSON lines (`id`, `prompt`, `answer`, `meta`), readable by `load_problems`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for p in problems:
            out.write(json.dumps({"id": p.id, "prompt": p.prompt, "answer": p.answer, "meta": p.meta}) + "\n")

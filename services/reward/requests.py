"""Checking a ScoreRequest before any scoring: every client mistake becomes one `BadRequest`
whose message names the field, which the servicer returns as INVALID_ARGUMENT."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

from cascade.config import (
    AgentReward,
    CodeReward,
    ConfigError,
    DomainConfig,
    PythonReward,
    SweReward,
    VerifierKind,
    parse_domain_config,
)
from cascade.domains import Problem
from cascade_proto.v1 import reward_pb2
from services.reward.batch import Batch

DOMAINS: tuple[str, ...] = get_args(VerifierKind)
"""The verifier kinds (a domain's name is free; its kind is one of these)."""
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class BadRequest(ValueError):
    """A request the service will not score; the message says which field and why."""


def parse_request(
    request: reward_pb2.ScoreRequest,
    *,
    max_items: int,
    python_functions: frozenset[str] = frozenset(),
    python_path: tuple[str, ...] = (),
) -> Batch:
    """The batch a request asks to score; `python_functions`: the user functions this service may
    call (`--python-reward`), any other `python` reward refused; `python_path` replaces the
    request's own (`--python-reward-path`)."""
    domain = request.domain
    if not _NAME.fullmatch(domain):
        raise BadRequest(f"domain: {domain[:60]!r} is not a domain name (lowercase letters, digits, _ and -)")
    reward = _json_object(request.reward_config_json, "reward_config_json", empty=None)
    if isinstance(reward, dict) and domain in DOMAINS:
        reward.setdefault("kind", domain)
    try:
        config = parse_domain_config({"name": domain, "reward": reward}, "reward_config_json")
    except ConfigError as err:
        raise BadRequest(str(err)) from None
    if isinstance(config.reward, PythonReward) and config.reward.function not in python_functions:
        allowed = ", ".join(sorted(python_functions)) or "none"
        raise BadRequest(
            f"reward_config_json: reward.function {config.reward.function!r} is not a function this "
            f"service runs (--python-reward; allowed: {allowed})"
        )
    if isinstance(config.reward, PythonReward):
        own = config.reward.model_copy(update={"python_path": [Path(p) for p in python_path]})
        config = config.model_copy(update={"reward": own})
    config = _sandboxed(config)
    if not request.items:
        raise BadRequest("items: empty batch (send at least one item)")
    if len(request.items) > max_items:
        raise BadRequest(f"items: {len(request.items)} items, more than this server's limit of {max_items}")
    problems: list[Problem] = []
    completions: list[str] = []
    for i, item in enumerate(request.items):
        if not item.HasField("problem"):
            raise BadRequest(f"items[{i}].problem: missing")
        p = item.problem
        if not p.id:
            raise BadRequest(f"items[{i}].problem.id: empty")
        meta = _json_object(p.meta_json, f"items[{i}].problem.meta_json", empty=None) or {}
        problems.append(Problem(id=p.id, domain=domain, prompt=p.prompt, answer=p.answer, meta=meta))
        completions.append(item.completion)
    return Batch(config, problems, completions)


def _json_object(text: str, field: str, *, empty: dict[str, Any] | None) -> dict[str, Any] | None:
    if not text.strip():
        return empty
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRequest(f"{field}: invalid JSON: {err}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"{field}: expected a JSON object, got {type(value).__name__}")
    return value


def _sandboxed(config: DomainConfig) -> DomainConfig:
    """The service runs code only in the bubblewrap sandbox: `auto` means `bwrap` here, and the
    plain-process harness (not a security boundary) is refused."""
    reward = config.reward
    if not isinstance(reward, CodeReward | SweReward | AgentReward) or reward.sandbox == "bwrap":
        return config
    if reward.sandbox == "process":
        raise BadRequest(
            "reward_config_json: reward.sandbox: 'process' is not a sandbox; "
            "this service runs code only in bubblewrap ('bwrap' or 'auto')"
        )
    return config.model_copy(update={"reward": reward.model_copy(update={"sandbox": "bwrap"})})

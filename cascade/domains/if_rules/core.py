"""The rule base class, the registry, and strict/loose checking."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

WORD_RE = re.compile(r"[A-Za-z0-9']+")
BULLET_RE = re.compile(r"^\s*-\s+\S")


def words(text: str) -> list[str]:
    """Words of a response (letters, digits, apostrophes; punctuation and bullets are not words)."""
    return WORD_RE.findall(text)


class Rule(ABC):
    """One verifiable instruction."""

    name: ClassVar[str]
    template: ClassVar[str]
    """Sentence stated in the prompt, formatted with the params."""
    description: ClassVar[str]
    """What the check verifies, for people reading the registry (not shown in prompts)."""
    arguments: ClassVar[dict[str, type]]
    """The params the rule takes, each with its JSON type (int, str or list)."""

    def __init__(self, **params: Any) -> None:
        _check_params(type(self), params)
        self.params = params
        self.validate()

    def validate(self) -> None:
        """Check param values beyond their types; raise ValueError on a bad one."""
        return None

    def describe(self) -> str:
        return self.template.format(**self.params)

    @abstractmethod
    def check(self, response: str) -> bool: ...

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


def _check_params(cls: type[Rule], params: dict[str, Any]) -> None:
    expected = cls.arguments
    missing = sorted(set(expected) - set(params))
    unknown = sorted(set(params) - set(expected))
    if missing or unknown:
        raise ValueError(
            f"rule {cls.name!r}: missing param(s) {missing}, unknown param(s) {unknown}; "
            f"expected {sorted(expected)}"
        )
    for key, kind in expected.items():
        value = params[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"rule {cls.name!r}: param {key!r} must be {kind.__name__}, got {value!r:.60}")


REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    if cls.name in REGISTRY:
        raise ValueError(f"rule {cls.name!r} registered twice")
    for attr in ("template", "description", "arguments"):
        if not hasattr(cls, attr):
            raise ValueError(f"rule {cls.name!r} has no {attr}")
    REGISTRY[cls.name] = cls
    return cls


def registry_spec() -> list[dict[str, Any]]:
    """Every registered rule: name, description, arguments (name -> type name) and prompt template."""
    return [
        {
            "name": name,
            "description": cls.description,
            "arguments": {key: kind.__name__ for key, kind in cls.arguments.items()},
            "template": cls.template,
        }
        for name, cls in sorted(REGISTRY.items())
    ]


def rule_from_json(record: dict[str, Any]) -> Rule:
    name = record.get("name")
    if name not in REGISTRY:
        raise ValueError(f"unknown instruction rule {name!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[name](**record.get("params", {}))


# --------------------------------------------------------------------------- strict and loose checks

CheckMode = Literal["strict", "loose"]


def loose_variants(response: str) -> list[str]:
    """IFEval's loose variants: the response with the first, last or both lines removed, each with
    and without `*` stripped; blank variants dropped, duplicates removed (order kept)."""
    variants: list[str] = []
    for text in (response, response.replace("*", "")):
        lines = text.split("\n")
        for candidate in (
            text,
            "\n".join(lines[1:]).strip(),
            "\n".join(lines[:-1]).strip(),
            "\n".join(lines[1:-1]).strip(),
        ):
            if candidate.strip() and candidate not in variants:
                variants.append(candidate)
    return variants


def check_rules(rules: Sequence[Rule], response: str, mode: CheckMode = "strict") -> list[bool]:
    """Whether each rule holds: on `response` itself (`strict`) or on any loose variant (`loose`).

    (Not `cascade.domains.instruct.check_rules`, which names the broken rules, strictly.)
    """
    if mode == "strict":
        return [rule.check(response) for rule in rules]
    if mode == "loose":
        variants = loose_variants(response)
        return [any(rule.check(v) for v in variants) for rule in rules]
    raise ValueError(f"unknown mode {mode!r}; expected 'strict' or 'loose'")

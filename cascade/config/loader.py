"""The hardened loader: YAML (or JSON) text to a `CascadeConfig`, every refusal a `ConfigError`.

A key given twice in one mapping is refused (YAML would keep the last), and so is nesting deeper
than `MAX_DEPTH`, checked while the text is parsed. A validation error becomes one line naming
the field path (`<source>: <field>: <message>`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from cascade.config.cascade import CascadeConfig
from cascade.config.domains import DomainConfig
from cascade.config.paths import with_paths_from

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a config may have (a real one nests about 5 deep).
Checked while the text is parsed, before anything is built from it: a document nested
thousands deep is refused in microseconds, never a RecursionError."""


class NestingTooDeep(ValueError):
    """A document nested deeper than the bound; the message names the bound."""

    def __init__(self, max_depth: int, where: str = "") -> None:
        super().__init__(f"{where}nested deeper than {max_depth} levels (the bound on a config's nesting)")
        self.max_depth = max_depth


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last) and a
    document nested deeper than `max_depth` (PyYAML's composer recurses once per level)."""

    max_depth = MAX_DEPTH

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        collection = self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent)
        if collection:
            self._depth += 1
            if self._depth > self.max_depth:
                mark = self.peek_event().start_mark
                where = f"line {mark.line + 1}, column {mark.column + 1}: "
                raise NestingTooDeep(self.max_depth, where)
        try:
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        finally:
            if collection:
                self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_JSON_SIGNIFICANT = re.compile(r'[\[\]{}"]')
_JSON_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)


def check_json_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise `NestingTooDeep` if the JSON text nests deeper than `max_depth` (brackets inside
    strings do not count), before `json.loads` would recurse into it. One linear pass;
    malformed text is left to the parser."""
    depth = 0
    pos = 0
    while (match := _JSON_SIGNIFICANT.search(text, pos)) is not None:
        char = match.group(0)
        pos = match.end()
        if char == '"':
            rest = _JSON_STRING_REST.match(text, pos)
            if rest is None:
                return  # an unterminated string: json.loads says where
            pos = rest.end()
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                raise NestingTooDeep(max_depth, f"character {match.start() + 1}: ")
        else:
            depth -= 1


class ConfigError(Exception):
    """A config that cannot be used; the message is one line naming the field."""


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-after"))
    # Discriminated unions put the tag in the path (e.g. `reward.code.mode`); keep it, it helps.
    msg = first["msg"]
    value = first.get("input")
    shown = "" if isinstance(value, dict | list) or value is None else f" (got {value!r})"
    extra = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    where = loc or "<root>"
    return f"{source}: {where}: {msg}{shown}{extra}"


def parse_cascade_config(data: object, source: str = "config") -> CascadeConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: <root>: expected a mapping, got {type(data).__name__}")
    try:
        return CascadeConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def parse_domain_config(data: object, source: str = "domain") -> DomainConfig:
    """One domain's config on its own (the reward service gets them per request)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: <root>: expected a mapping, got {type(data).__name__}")
    try:
        return DomainConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def _load_yaml(text: str, max_depth: int) -> object:
    loader = _UniqueKeyLoader(text)
    loader.max_depth = max_depth
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_cascade_yaml(text: str, source: str = "config", *, max_depth: int = MAX_DEPTH) -> CascadeConfig:
    """A cascade from YAML text (the control plane receives configs this way): a key given
    twice is an error, as is nesting deeper than `max_depth` and anything the models refuse."""
    try:
        data = _load_yaml(text, max_depth)
    except NestingTooDeep as err:
        raise ConfigError(f"{source}: invalid YAML: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}: invalid YAML: {where}{problem}") from None
    except RecursionError:  # belt and braces: the depth bound should make this unreachable
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None
    return parse_cascade_config(data, source)


def parse_cascade_json(text: str, source: str = "config", *, max_depth: int = MAX_DEPTH) -> CascadeConfig:
    """A cascade from JSON text, with the same nesting bound as YAML."""
    try:
        check_json_depth(text, max_depth)
        data = json.loads(text)
    except NestingTooDeep as err:
        raise ConfigError(f"{source}: invalid JSON: {err}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid JSON: nested too deeply") from None
    except ValueError as err:
        raise ConfigError(f"{source}: invalid JSON: {err}") from None
    return parse_cascade_config(data, source)


def load_cascade_config(path: str | Path) -> CascadeConfig:
    """The cascade in a YAML (or JSON) file. Every relative path in it (`model.path`,
    `output_dir`, prompt files, tracker directories, `chat.template_path`, ...; defaults such as
    `output_dir: runs` too) is taken from the file's directory, not the working directory, and
    made absolute: the file means the same from anywhere, and so does everything that gets the
    config from here (the runner, `cascade up`'s processes, run.json, the control plane)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    config = parse_cascade_yaml(text, str(path))
    try:
        return with_paths_from(config, Path(os.path.abspath(path)).parent)
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from None


def dump_cascade_yaml(config: CascadeConfig) -> str:
    """`config` as YAML, every field given (defaults filled in) in the models' order: what
    `--print-config` prints. Loading the text back gives `config` again (its paths as they are:
    absolute once the config came from `load_cascade_config`)."""
    data = config.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)

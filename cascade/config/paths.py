"""What a config names on disk: what is missing (`check_paths`: `cascade validate`, `cascade
run`), and every path it names, resolved (`config_paths`, `with_resolved_paths`: the control
plane confines them to its roots, the runner's config diff compares them)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from cascade.config.cascade import CascadeConfig
from cascade.config.domains import JsonlPrompts, RlhfReward
from cascade.config.hf import HfPrompts


def check_paths(cfg: CascadeConfig) -> list[str]:
    """What the config names on disk and is not there: one `field: problem` line per missing or
    wrong-kind path (empty when all is well). Relative paths are checked as the runner reads
    them: from the working directory (the model's also next to the config file, as
    `load_cascade_config` resolved it).

    Kept apart from the schema checks: the control plane validates configs for runners on
    other hosts (it need not hold the model); `cascade validate` and `cascade run` call both.
    """
    problems: list[str] = []

    def shown(path: Path) -> str:
        return str(path) if path.is_absolute() else f"{path} ({path.absolute()})"

    def model_dir(field: str, path: Path, hint: str = "") -> None:
        if not path.exists():
            problems.append(f"{field}: {shown(path)} does not exist{hint}")
        elif not (path / "config.json").is_file():
            problems.append(f"{field}: {shown(path)} is not a model directory (no config.json){hint}")

    model_dir("model.path", cfg.model.path, " (build the tiny one with `cascade model init`)")
    for i, domain in enumerate(cfg.domains):
        if isinstance(domain.prompts, JsonlPrompts):
            for name in ("train_path", "eval_path"):
                path = getattr(domain.prompts, name)
                if not path.exists():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} does not exist")
                elif not path.is_file():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} is not a file")
        if isinstance(domain.prompts, HfPrompts):
            sources = [("path", domain.prompts.path)] if domain.prompts.path is not None else []
            for split, files in (domain.prompts.data_files or {}).items():
                sources += [(f"data_files.{split}.{j}", f) for j, f in enumerate(files)]
            for name, path in sources:
                if path is not None and not path.exists():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} does not exist")
        if isinstance(domain.reward, RlhfReward):
            model_dir(f"domains.{i}.reward.model_path", domain.reward.model_path)
    if cfg.chat.template_path is not None:
        path = cfg.chat.template_path
        if not path.exists():
            problems.append(f"chat.template_path: {shown(path)} does not exist")
        elif not path.is_file():
            problems.append(f"chat.template_path: {shown(path)} is not a file")
    why = unwritable_dir(cfg.output_dir)
    if why is not None:
        problems.append(f"output_dir: {shown(cfg.output_dir)} {why}")
    return problems


def unwritable_dir(path: Path) -> str | None:
    """Why the runner could not create `path` (as `mkdir -p`) or write in it; None when it
    can. Nothing is created: an existing directory must be writable, else the nearest
    existing directory above it, and nothing on the way may be a file."""
    probe = path.absolute()
    missing = False
    while not probe.exists():
        if probe.is_symlink():
            return f"cannot be created: {probe} is a dangling symlink"
        missing = True
        probe = probe.parent
    if not probe.is_dir():
        if not missing:
            return "exists and is not a directory"
        return f"cannot be created: {probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return "is not writable" if not missing else f"cannot be created: {probe} is not writable"
    return None


# --------------------------------------------------------------------------- every path, resolved

PathKind = Literal["output", "model", "data"]
"""What the runner does with a path: writes under it (`output`: the run directory's parent,
tracker directories and stores), reads a model or tokenizer from it (`model`), reads prompts
from it (`data`)."""


@dataclass(frozen=True)
class ConfigPath:
    """One path a config names: its dotted field, where it sits in the config, what it holds."""

    field: str
    loc: tuple[str | int, ...]
    path: Path
    kind: PathKind


def resolve_path(path: Path | str, base: Path) -> Path:
    """`path` as the runner's file system calls will see it: absolute from `base` (a relative
    path), `..` taken away and every symlink on it followed as far as it exists
    (`os.path.realpath`). ValueError for a path no file system call accepts (a NUL byte)."""
    try:
        return Path(os.path.realpath(base / path))
    except (ValueError, OSError) as err:
        raise ValueError(f"not a usable path ({err})") from None


def _kind(loc: tuple[str | int, ...]) -> PathKind:
    if loc[:1] in (("model",), ("chat",)) or (loc[:1] == ("domains",) and loc[2:3] == ("reward",)):
        return "model"  # the policy, a reward model, a judge, a chat template (file or tokenizer)
    if loc[:1] == ("domains",) and loc[2:3] == ("prompts",):
        return "data"
    # output_dir, tracking.* and any Path field added later without a place here: the strictest
    return "output"


_MLFLOW_FILE_STORES = ("sqlite:///", "file://", "file:")


def _mlflow_local_store(uri: str) -> tuple[str, str] | None:
    """A tracking URI that MLflow opens as a local file or directory: (its prefix, the path);
    None for a server, a database or Databricks."""
    for prefix in _MLFLOW_FILE_STORES:
        if uri.startswith(prefix):
            return prefix, uri[len(prefix) :]
    if "://" in uri or uri.startswith("databricks"):
        return None
    return "", uri  # a bare path: MLflow's file store


def config_paths(cfg: CascadeConfig) -> list[ConfigPath]:
    """Every path `cfg` names, in field order: each `Path` field at any depth (lists and
    mappings included) and `tracking.mlflow.tracking_uri` when it is a local store."""
    out: list[ConfigPath] = []

    def walk(value: object, loc: tuple[str | int, ...]) -> None:
        if isinstance(value, Path):
            out.append(ConfigPath(".".join(map(str, loc)), loc, value, _kind(loc)))
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name), (*loc, name))
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(item, (*loc, i))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*loc, str(key)))

    walk(cfg, ())
    uri = cfg.tracking.mlflow.tracking_uri
    store = _mlflow_local_store(uri) if uri else None
    if store is not None:
        loc = ("tracking", "mlflow", "tracking_uri")
        out.append(ConfigPath(".".join(loc), loc, Path(store[1]), "output"))
    return out


def with_resolved_paths(cfg: CascadeConfig, base: Path) -> CascadeConfig:
    """`cfg` with every path it names (`config_paths`) replaced by `resolve_path(path, base)`:
    what is checked is then what the runner opens, from whichever directory it runs.
    ValueError names the field of a path that cannot be resolved."""
    return _with_paths(cfg, lambda path: resolve_path(path, base))


def with_paths_from(cfg: CascadeConfig, base: Path) -> CascadeConfig:
    """`cfg` with every relative path it names taken from `base` (made absolute, `..` folded,
    symlinks kept as written); absolute paths as they are. `load_cascade_config` passes the
    config file's directory: a path in a file means the same from any working directory."""

    def absolute(path: Path) -> Path:
        if path.is_absolute():
            return path
        try:
            return Path(os.path.abspath(base / path))
        except (ValueError, OSError) as err:
            raise ValueError(f"not a usable path ({err})") from None

    if all(entry.path.is_absolute() for entry in config_paths(cfg)):
        return cfg
    return _with_paths(cfg, absolute)


def _with_paths(cfg: CascadeConfig, resolve: Callable[[Path], Path]) -> CascadeConfig:
    data = cfg.model_dump(mode="json")
    for entry in config_paths(cfg):
        try:
            resolved = str(resolve(entry.path))
        except ValueError as err:
            raise ValueError(f"{entry.field}: {err}") from None
        if entry.field == "tracking.mlflow.tracking_uri":
            store = _mlflow_local_store(cfg.tracking.mlflow.tracking_uri or "")
            assert store is not None
            resolved = store[0] + resolved if store[0] else resolved
        parent: Any = data
        for key in entry.loc[:-1]:
            parent = parent[key]
        parent[entry.loc[-1]] = resolved
    return CascadeConfig.model_validate(data)

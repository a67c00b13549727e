"""Several named teachers (one per finished domain) loaded on demand within a memory budget.

A cascade's teachers are the best checkpoints of earlier domains; a late stage may have four or
five, and they need not all be resident at once. A teacher loads on first use; when loading it
would exceed the budget, the least recently used resident teachers are dropped first. Pointing
a name at a new checkpoint (a domain's new best) drops the old weights; the new ones load on
next use. Sizes are known before loading, from the safetensors headers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from cascade.engine.weights import embedding_rows, header_specs
from cascade.model.loading import DTYPES, load_model_weights_only


class UnknownTeacherError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class TeacherLoadError(RuntimeError):
    """The teacher's checkpoint cannot be used (missing, unreadable, or over the budget)."""


@dataclass(frozen=True)
class LoadedTeacher:
    name: str
    path: str
    model: PreTrainedModel
    pad_id: int
    vocab_size: int
    max_context: int


@dataclass(frozen=True)
class TeacherStatus:
    name: str
    path: str
    loaded: bool
    bytes: int


@dataclass
class _Entry:
    path: Path
    model: PreTrainedModel | None = None
    bytes: int = 0
    last_used: float = 0.0


Loader = Callable[[Path, str, str], PreTrainedModel]


def _default_loader(path: Path, dtype: str, device: str) -> PreTrainedModel:
    return load_model_weights_only(path, dtype=dtype, device=device)


def check_teacher_dir(path: str | Path) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise TeacherLoadError(f"{p}: not a model directory (no config.json)")
    return p


class TeacherPool:
    def __init__(
        self,
        teachers: Mapping[str, str | Path],
        *,
        memory_budget_bytes: int,
        dtype: str = "float32",
        device: str = "cpu",
        loader: Loader = _default_loader,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} not one of {sorted(DTYPES)}")
        self.memory_budget_bytes = memory_budget_bytes
        self.dtype = dtype
        self.device = device
        self._loader = loader
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self.loads = 0
        self.evictions = 0
        for name, path in teachers.items():
            self.set(name, path)

    def set(self, name: str, path: str | Path) -> TeacherStatus:
        if not name:
            raise ValueError("teacher name: empty")
        p = check_teacher_dir(path)
        with self._lock:
            old = self._entries.get(name)
            if old is not None and old.path == p:
                return self._status(name, old)
            if old is not None and old.model is not None and old.bytes:  # a name sharing it counts it now
                heir = next(
                    (e for e in self._entries.values() if e is not old and e.model is old.model), None
                )
                if heir is not None:
                    heir.bytes = old.bytes
            self._entries[name] = _Entry(path=p)
            return self._status(name, self._entries[name])

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def statuses(self) -> list[TeacherStatus]:
        with self._lock:
            return [self._status(n, e) for n, e in sorted(self._entries.items())]

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return sum(e.bytes for e in self._entries.values() if e.model is not None)

    def get(self, name: str) -> LoadedTeacher:
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                known = ", ".join(sorted(self._entries)) or "none"
                raise UnknownTeacherError(f"unknown teacher {name!r} (known: {known})")
            if entry.model is None:
                self._load(name, entry)
            entry.last_used = time.monotonic()
            model = entry.model
            assert model is not None
            context = int(getattr(model.config, "max_position_embeddings", 0) or 2**31 - 1)
            return LoadedTeacher(name, str(entry.path), model, _pad_id(model), embedding_rows(model), context)

    def _load(self, name: str, entry: _Entry) -> None:
        twin = next(
            (
                e
                for e in self._entries.values()
                if e is not entry and e.path == entry.path and e.model is not None
            ),
            None,
        )
        if twin is not None:  # several domains' best checkpoint is one directory: one copy, counted once
            entry.model, entry.bytes = twin.model, 0
            return
        size = self._size(entry.path)
        if size > self.memory_budget_bytes:
            raise TeacherLoadError(
                f"teacher {name!r}: {size / 2**20:.1f} MiB of weights exceed the memory budget of "
                f"{self.memory_budget_bytes / 2**20:.1f} MiB"
            )
        resident = sorted(
            ((n, e) for n, e in self._entries.items() if e.model is not None), key=lambda ne: ne[1].last_used
        )
        used = sum(e.bytes for _, e in resident)
        for _, other in resident:
            if used + size <= self.memory_budget_bytes:
                break
            used -= other.bytes
            for sharing in self._entries.values():  # a shared copy goes for every name holding it
                if sharing.path == other.path:
                    sharing.model = None  # callers still scoring with it keep their reference
            self.evictions += 1
        try:
            entry.model = self._loader(entry.path, self.dtype, self.device)
        except Exception as err:
            raise TeacherLoadError(f"teacher {name!r}: cannot load {entry.path}: {err}") from err
        entry.bytes = sum(p.numel() * p.element_size() for p in entry.model.parameters())  # tied: once
        self.loads += 1

    def _size(self, path: Path) -> int:
        try:
            specs = header_specs(path)
        except Exception as err:
            raise TeacherLoadError(f"{path}: unreadable checkpoint ({err})") from err
        width = torch.empty((), dtype=DTYPES[self.dtype]).element_size()
        total = 0
        for spec in specs.values():
            numel = 1
            for d in spec.shape:
                numel *= d
            total += numel * width
        return total

    @staticmethod
    def _status(name: str, entry: _Entry) -> TeacherStatus:
        return TeacherStatus(name, str(entry.path), entry.model is not None, entry.bytes)


def _pad_id(model: PreTrainedModel) -> int:
    """Any valid id: padded positions are masked out of attention and out of the scores."""
    cfg = model.config
    for value in (getattr(cfg, "pad_token_id", None), getattr(cfg, "eos_token_id", None)):
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int):
            return value
    return 0

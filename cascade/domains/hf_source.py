"""Read a `kind: hf` prompt source: a Hugging Face data set on disk -> training and eval problems.

Per split: read (`datasets.load_dataset` on `data_files`, or `load_from_disk`), keep rows
matching `filters`, convert each with the adapter (`hf_adapters`; a row it cannot express is
skipped, counted and warned about), drop repeated prompts, shuffle with `seed`. The eval
problems are `eval_split`'s first `n_eval`, or `n_eval` rows held out of the training split;
training then drops any prompt the eval holds, and keeps its first `n_train`.
`SplitReport` says what each step kept (shown by `cascade data inspect`).

Errors a user must fix (a missing split or column, an unknown IFEval instruction id) raise
`HfSourceError`, one line naming the domain and the config field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

from cascade.config.hf import HfPrompts
from cascade.domains.base import Problem
from cascade.domains.hf_adapters import ADAPTERS, Unconvertible, required_columns

log = logging.getLogger(__name__)

_FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}
MAX_REASONS = 5


class HfSourceError(ValueError):
    """A data set that does not fit its config (one line naming the domain and the field)."""


@dataclass
class SplitReport:
    """What one of our splits kept at each step."""

    split: str
    """Ours: train or eval."""
    source_split: str
    """The data set's split it was read from."""
    rows: int = 0
    filtered_out: int = 0
    unconvertible: int = 0
    duplicates: int = 0
    overlap: int = 0
    """Training rows dropped because the eval holds the same prompt."""
    held_out: int = 0
    """Training rows moved to the eval (no `eval_split`)."""
    capped: int = 0
    """Rows past `n_train` / `n_eval`."""
    kept: int = 0
    reasons: list[str] = field(default_factory=list)
    """The first unconvertible rows' reasons."""


@dataclass
class HfLoad:
    train: list[Problem]
    eval: list[Problem]
    reports: dict[str, SplitReport]


def read_split(source: HfPrompts, split: str, where: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows and column names of one split of the data set."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        if source.data_files is not None:
            files = source.data_files.get(split)
            if files is None:
                raise HfSourceError(
                    f"{where}.data_files: no split {split!r}; have {sorted(source.data_files)}"
                )
            kinds = {_FORMATS.get(_suffix(f)) for f in files}
            if None in kinds or len(kinds) != 1:
                raise HfSourceError(
                    f"{where}.data_files.{split}: files must all be one of .parquet, .arrow, .jsonl, "
                    f".json; got {[str(f) for f in files]}"
                )
            dataset = datasets.load_dataset(
                kinds.pop(), data_files={split: [str(f) for f in files]}, split=split
            )
        else:
            assert source.path is not None, "validated by HfPrompts"
            loaded = datasets.load_from_disk(str(source.path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise HfSourceError(
                        f"{where}.path: {source.path} has no split {split!r}; have {sorted(loaded)}"
                    )
                dataset = loaded[split]
            elif split != source.train_split:
                raise HfSourceError(
                    f"{where}.path: {source.path} is one Dataset, not a DatasetDict with {split!r}"
                )
            else:
                dataset = loaded
    except HfSourceError:
        raise
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise HfSourceError(f"{where}: cannot read split {split!r}: {message}") from None
    return dataset.to_list(), list(dataset.column_names)


def _suffix(path: Path) -> str:
    return path.suffix.lower()


def prompt_key(prompt: str) -> str:
    """What dedup compares: the prompt with whitespace runs collapsed, case folded."""
    return " ".join(prompt.split()).casefold()


def _convert_split(
    source: HfPrompts, domain: str, split: str, report: SplitReport, where: str
) -> list[Problem]:
    rows, columns = read_split(source, split, where)
    report.rows = len(rows)
    for name in [*required_columns(source), *source.filters]:
        if name not in columns:
            field_name = f"filters.{name}" if name in source.filters else "adapter"
            raise HfSourceError(
                f"{where}.{field_name}: column {name!r} (needed by adapter {source.adapter!r}) missing "
                f"from split {split!r}; columns: {columns}"
            )
    adapter = ADAPTERS[source.adapter]
    problems: list[Problem] = []
    seen_keys: set[str] = set()
    seen_ids: set[str] = set()
    for index, row in enumerate(rows):
        if any(row[name] not in values for name, values in source.filters.items()):
            report.filtered_out += 1
            continue
        try:
            converted = adapter.convert(row, source)
        except Unconvertible as err:
            report.unconvertible += 1
            if len(report.reasons) < MAX_REASONS:
                report.reasons.append(f"row {index}: {err}")
            continue
        except ValueError as err:  # e.g. an unknown IFEval instruction id: the user's to fix
            raise HfSourceError(f"{where}.adapter: split {split!r} row {index}: {err}") from None
        prompt = f"{converted.prompt}\n\n{source.instruction}" if source.instruction else converted.prompt
        key = prompt_key(prompt)
        if source.dedup and key in seen_keys:
            report.duplicates += 1
            continue
        seen_keys.add(key)
        problem_id = converted.id or f"{domain}-{split}-{index}"
        if problem_id in seen_ids:
            problem_id = f"{problem_id}-{index}"
        seen_ids.add(problem_id)
        meta = {**converted.meta, "source_split": split, "source_row": index}
        problems.append(
            Problem(id=problem_id, domain=domain, prompt=prompt, answer=converted.answer, meta=meta)
        )
    if report.unconvertible:
        log.warning(
            "%s: split %r: skipped %d row(s) adapter %r cannot convert (first: %s)",
            where,
            split,
            report.unconvertible,
            source.adapter,
            report.reasons[0],
        )
    Random(source.seed).shuffle(problems)
    return problems


def load_hf(source: HfPrompts, domain: str) -> HfLoad:
    """Training and eval problems of an hf source, with what each step kept."""
    where = f"domain {domain}: prompts"
    train_report = SplitReport("train", source.train_split)
    train = _convert_split(source, domain, source.train_split, train_report, where)
    if source.eval_split is not None:
        eval_report = SplitReport("eval", source.eval_split)
        evals = _convert_split(source, domain, source.eval_split, eval_report, where)
        eval_report.capped = max(0, len(evals) - source.n_eval)
        evals = evals[: source.n_eval]
    else:
        if source.n_eval >= len(train):
            raise HfSourceError(
                f"{where}.n_eval: holding out {source.n_eval} of the {len(train)} usable training "
                f"problems leaves none to train on (lower n_eval or set eval_split)"
            )
        eval_report = SplitReport("eval", f"{source.train_split} (held out)")
        evals, train = train[: source.n_eval], train[source.n_eval :]
        eval_report.rows = train_report.held_out = len(evals)
    held = {prompt_key(p.prompt) for p in evals}
    before = len(train)
    train = [p for p in train if prompt_key(p.prompt) not in held]
    train_report.overlap = before - len(train)
    if source.n_train is not None:
        train_report.capped = max(0, len(train) - source.n_train)
        train = train[: source.n_train]
    if not train:
        raise HfSourceError(f"{where}: no training problems left in split {source.train_split!r}")
    if not evals:
        raise HfSourceError(f"{where}: no eval problems left in split {eval_report.source_split!r}")
    train_report.kept, eval_report.kept = len(train), len(evals)
    return HfLoad(train, evals, {"train": train_report, "eval": eval_report})

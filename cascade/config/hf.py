"""The `kind: hf` prompt source: a Hugging Face data set on disk, read through a format adapter.

Kept apart from the domain section (`cascade.config.domains`, which imports it into
`PromptSource`) so the data-set options sit together; the reading itself is
`cascade.domains.hf_source`, the adapters `cascade.domains.hf_adapters`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AdapterName = Literal["gsm8k", "math", "mbpp", "humaneval", "ifeval", "swe", "bfcl", "generic"]

ADAPTER_DOMAINS: dict[str, str | None] = {
    "gsm8k": "math",
    "math": "math",
    "mbpp": "code",
    "humaneval": "code",
    "ifeval": "if",
    "swe": "swe",
    "bfcl": "agent",
    "generic": None,
}
"""The domain each adapter's problems are for (None: any, the mapping decides)."""

FilterValue = str | int | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GenericFields(_Strict):
    """Which columns make a problem, for a schema without a named adapter."""

    prompt: str
    """Column holding the user message."""
    answer: str
    """Column holding the gold answer (math), reference program (code) or patch (swe)."""
    id: str | None = None
    """Column holding a stable id; default `<domain>-<split>-<row>`."""
    meta: dict[str, str] = {}
    """`meta key: column` pairs copied into the problem's meta (e.g. `tests: test_cases` for
    code, in the sandbox's test format; `rules: rules` for if)."""


class HfPrompts(_Strict):
    """Prompts from a Hugging Face data set on disk, converted by a named format adapter.

    Either `data_files` (split -> parquet / arrow / jsonl files, read with
    `datasets.load_dataset`) or `path` (a `save_to_disk` directory, read with
    `datasets.load_from_disk`). Per split, rows are filtered (`filters`), converted (a row the
    adapter cannot convert is skipped with a warning and counted), deduplicated by prompt,
    shuffled with `seed` and capped. The eval split is `eval_split` when set, else `n_eval`
    rows held out of the training split; training never sees a prompt the eval holds.
    """

    kind: Literal["hf"] = "hf"
    adapter: AdapterName
    """The public schema: gsm8k, math, mbpp, humaneval, ifeval, swe, or generic (`fields`)."""
    data_files: dict[str, list[Path]] | None = None
    """Split name -> data files (.parquet, .arrow, .jsonl / .json; one format per split)."""
    path: Path | None = None
    """A directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    train_split: str = "train"
    eval_split: str | None = None
    """Split for the domain's eval; None holds `n_eval` rows out of `train_split` instead."""
    n_eval: int = Field(64, ge=1)
    """Eval problems: held out of the training split, or the first of the shuffled eval split."""
    n_train: int | None = Field(None, ge=1)
    """Training problems kept after shuffling (None: all)."""
    seed: int = 0
    """Shuffle seed (the order of training prompts and which rows are held out)."""
    filters: dict[str, list[FilterValue]] = {}
    """Keep rows whose column equals one of the listed values, e.g. `level: [Level 1, Level 2]`."""
    dedup: bool = True
    """Drop rows whose prompt repeats one already kept (whitespace and case ignored)."""
    instruction: str = ""
    """Text appended to every prompt, e.g. `Put the final answer in \\boxed{}.`"""
    fields: GenericFields | None = None
    """Column mapping; required by (and only for) the generic adapter."""
    files_column: str = "files"
    """swe: column with repository files shown in the prompt (path -> text, or a list of
    `{path, content}`), used when present."""
    unknown_instructions: Literal["error", "skip"] = "error"
    """ifeval: an instruction id with no registered rule fails loading (`error`, naming it) or
    skips its row with a warning (`skip`)."""

    @model_validator(mode="after")
    def _check(self) -> HfPrompts:
        if (self.data_files is None) == (self.path is None):
            raise ValueError("give exactly one of `data_files` (split -> files) or `path` (save_to_disk dir)")
        if self.data_files is not None:
            if self.train_split not in self.data_files:
                raise ValueError(f"data_files has no {self.train_split!r} split (train_split)")
            if self.eval_split is not None and self.eval_split not in self.data_files:
                raise ValueError(f"data_files has no {self.eval_split!r} split (eval_split)")
            for split, files in self.data_files.items():
                if not files:
                    raise ValueError(f"data_files.{split}: no files")
        if self.adapter == "generic" and self.fields is None:
            raise ValueError("adapter 'generic' needs `fields` (prompt, answer, id, meta columns)")
        if self.adapter != "generic" and self.fields is not None:
            raise ValueError(
                f"`fields` is for adapter 'generic' only; adapter {self.adapter!r} knows its columns"
            )
        return self

    def check_domain(self, domain: str) -> None:
        """Raise ValueError when the adapter's problems are not for `domain`."""
        expected = ADAPTER_DOMAINS[self.adapter]
        if expected is not None and expected != domain:
            raise ValueError(f"prompts.adapter {self.adapter!r} makes {expected} problems, not {domain}")

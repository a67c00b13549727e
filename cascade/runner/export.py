"""`cascade export`: one of a run's checkpoints as a plain Hugging Face model directory (the
model's `config.json`, `generation_config.json`, its weights, the tokenizer's files and chat
template), without what only a resume needs: optimizer, master weights, RNG, runner state,
manifest, a sharded learner's `dcp/` shards.

Which checkpoint (`--checkpoint`): `latest` (the newest in `<run>/checkpoints`), `step-N`
(that one), or `best:<domain>` (the domain's best checkpoint as the run keeps it for
distillation teachers: the teacher registry of the newest checkpoint that verifies, which is
what a resume restores, pointing into `<run>/teachers`). The checkpoint is verified first, as a
resume verifies it (`verify_checkpoint`: the manifest's sizes and checksums, finite weights,
readable state; a teacher directory, written without a manifest, by `model_dir_problem`): one
that does not verify is refused in one line naming the problem, and nothing is written.

The weights are the checkpoint's model directory as it is: in the run's `model.dtype` (what
teachers and rollout replicas load). A sharded learner's checkpoint holds the same full model
directory beside its shards (rank 0 writes it), so it exports the same way. When the run
rendered its prompts with its own chat template (`chat.template` / `chat.template_path`), the
export carries that template in place of the tokenizer's. The directory is written beside
`OUT_DIR` and renamed into place; its files are readable as the umask allows.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from cascade.model.files import as_umask_allows
from cascade.parallel.checkpoint import MASTER_FILE, OPTIM_FILE, STATE_FILE
from cascade.runner.checkpoint import (
    MANIFEST_FILE,
    RNG_FILE,
    finished_checkpoints,
    model_dir_problem,
    newest_verified_checkpoint,
    read_runner_state,
    verify_checkpoint,
)
from cascade.runner.run_state import RunDirError

RESUME_ONLY = frozenset({OPTIM_FILE, MASTER_FILE, RNG_FILE, STATE_FILE, MANIFEST_FILE})
"""A checkpoint's files that only a resume reads: never exported (nor any directory, `dcp/`)."""
TEMPLATE_FILE = "chat_template.jinja"
STEP = re.compile(r"step-(\d+)")


class ExportError(Exception):
    """An export that cannot be made: one line naming the checkpoint or directory and why."""


@dataclass(frozen=True)
class Source:
    """The directory whose model files are exported, and how to name it in a message."""

    path: Path
    label: str


@dataclass
class Exported:
    source: Source
    out_dir: Path
    files: list[str]
    bytes: int
    dtype: str | None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        dtype = f", weights in {self.dtype}" if self.dtype else ""
        return (
            f"exported {self.source.label} to {self.out_dir}: {len(self.files)} files, "
            f"{self.bytes / 2**20:,.1f} MiB{dtype} ({', '.join(self.files)})"
        )


def find_source(run_dir: Path, selector: str) -> Source:
    """The verified directory `selector` names in `run_dir`; ExportError (one line) otherwise."""
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a run directory (it does not exist)")
    root = run_dir / "checkpoints"
    if selector.startswith("best:"):
        return _best(run_dir, root, selector[len("best:") :])
    found = finished_checkpoints(root)
    if not found:
        raise ExportError(f"{root} holds no checkpoint (the run has not checkpointed yet)")
    if selector == "latest":
        path = found[-1]
    else:
        m = STEP.fullmatch(selector)
        if m is None:
            raise ExportError(f"--checkpoint {selector}: not latest, best:<domain> or step-N")
        path = root / f"step-{int(m.group(1)):06d}"
        if path not in found:
            names = ", ".join(p.name for p in found)
            raise ExportError(f"{root} has no checkpoint {path.name} (it has {names})")
    problem = verify_checkpoint(path)
    if problem is not None:
        before = found[: found.index(path)]
        older = next((p for p in reversed(before) if verify_checkpoint(p) is None), None)
        hint = (
            f"; {older.name} verifies: --checkpoint step-{int(older.name.split('-')[1])}"
            if older is not None
            else ""
        )
        raise ExportError(f"{path} does not verify: {problem}{hint}")
    return Source(path, f"{path.name} of {run_dir}")


def _best(run_dir: Path, root: Path, domain: str) -> Source:
    try:
        base = newest_verified_checkpoint(root, log=lambda _line: None)
    except RunDirError as err:
        raise ExportError(str(err)) from None
    if base is None:
        raise ExportError(f"{root} holds no checkpoint, so no teacher registry to find best:{domain} in")
    teachers = read_runner_state(base).get("teachers", {}).get("teachers", {})
    entry = teachers.get(domain)
    if entry is None:
        known = ", ".join(f"best:{d}" for d in teachers) or "none yet"
        raise ExportError(
            f"{domain!r} has no best checkpoint in {base.name}'s teacher registry (known: {known})"
        )
    # by name under this run directory: the recorded path may be relative to another working
    # directory, or the run directory may have moved since
    path = run_dir / "teachers" / Path(str(entry["path"])).name
    problem = model_dir_problem(path)
    if problem is not None:
        raise ExportError(
            f"{path} (best:{domain}, from {base.name}'s teacher registry) does not verify: {problem}"
        )
    score, step = float(entry["score"]), int(entry["step"])
    return Source(path, f"best:{domain} of {run_dir} ({path.name}: score {score:g} at global step {step})")


def _check_out_dir(out_dir: Path, run_dir: Path, force: bool) -> None:
    out, run = out_dir.resolve(), run_dir.resolve()
    if run == out or run.is_relative_to(out):
        raise ExportError(f"{out_dir} holds the run directory {run_dir}: export somewhere else")
    for inner in ("checkpoints", "teachers", "references"):
        if out.is_relative_to(run / inner):
            raise ExportError(f"{out_dir} is inside the run's {inner}/: export somewhere else")
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise ExportError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"{out_dir} exists and is not empty: give --force to replace it")


def run_chat_template(run_dir: Path) -> str | None:
    """The chat template the run rendered its prompts with when its config gave one (None: the
    tokenizer's own, or no readable run.json)."""
    from cascade.config import CascadeConfig
    from cascade.runner.record import read_record

    try:
        record = read_record(run_dir)
        if record is None:
            return None
        return CascadeConfig.model_validate(record.config).chat.template_text()
    except (OSError, ValueError):
        return None


def _use_template(directory: Path, text: str) -> None:
    (directory / TEMPLATE_FILE).write_text(text, encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if config.is_file():
        data = json.loads(config.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "chat_template" in data:
            data["chat_template"] = text
            config.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def _dtype(directory: Path) -> str | None:
    try:
        data = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = (data.get("dtype") or data.get("torch_dtype")) if isinstance(data, dict) else None
    return str(value) if value else None


def export_model(run_dir: Path, out_dir: Path, selector: str = "latest", *, force: bool = False) -> Exported:
    """Write the model directory of `selector`'s checkpoint in `run_dir` to `out_dir`."""
    source = find_source(run_dir, selector)
    _check_out_dir(out_dir, run_dir, force)
    names = sorted(p.name for p in source.path.iterdir() if p.is_file() and p.name not in RESUME_ONLY)
    tmp = out_dir.with_name(f".{out_dir.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    notes: list[str] = []
    try:
        tmp.mkdir(parents=True)
        for name in names:
            shutil.copyfile(source.path / name, tmp / name)
        template = run_chat_template(run_dir)
        if template is not None:
            _use_template(tmp, template)
            notes.append("the chat template is the run's (chat.template / chat.template_path)")
            if TEMPLATE_FILE not in names:
                names = sorted([*names, TEMPLATE_FILE])
        as_umask_allows(tmp)
        if out_dir.is_dir():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"{out_dir} could not be written: {err.strerror or err}") from None
    size = sum((out_dir / n).stat().st_size for n in names)
    return Exported(source, out_dir, names, size, _dtype(out_dir), notes)

"""Resumable checkpoints: model weights, optimizer state and RNG state as safetensors, plus
the runner's plain state as JSON. A checkpoint directory is also a loadable Hugging Face
checkpoint (teachers and the rollout service load it with `from_pretrained`). Tensors are
written from CPU copies whatever device the learner trains on, so a checkpoint made on a GPU
resumes on the CPU and back.

The model directory holds the weights in the checkpoint's dtype (`Policy.save_dtype`, the run's
`model.dtype`: what teachers, references and rollout replicas load), while the policy trains on
float32 master weights (`cascade.model.loading.MASTER_DTYPE`). When the two differ, a resumable
checkpoint also holds the master weights (`MASTER_FILE`; a sharded learner's are its `dcp/`
shards), so a run resumes from the weights it stopped at, not their rounding.

A checkpoint is written to a temporary directory and renamed into place, so a crash while
writing never leaves a half checkpoint that `--resume` would pick up. Its last file is a manifest
(`MANIFEST_FILE`): every other file's relative path, size and sha256, the `dcp/` shards of every
rank included. A resume takes the newest checkpoint that proves itself
(`newest_verified_checkpoint`): its files match the manifest, its weights are finite, its
optimizer state is not zeroed; a damaged one is skipped, in one log line, for the one before it.
A write that fails (a full disk) raises `CheckpointWriteError`, one line naming the directory
and the reason, and leaves the checkpoints before it as they were.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file, save_model
from torch.distributed.checkpoint.api import CheckpointException

from cascade.model.files import as_umask_allows
from cascade.model.loading import DTYPES, MASTER_DTYPE, Policy
from cascade.parallel.checkpoint import DCP_DIR, MASTER_FILE, OPTIM_FILE, STATE_FILE
from cascade.runner.run_state import RunDirError

RNG_FILE = "rng.safetensors"
MANIFEST_FILE = "manifest.json"
"""A checkpoint's last file: `{"version", "hash", "files": {relative path: {"bytes", "sha256"}}}`
over every other file in it (a checkpoint without one was written before checksums)."""
MANIFEST_VERSION = 1
CHECKPOINT_NAME = re.compile(r"step-(\d{6,})")
"""A checkpoint's directory name, exactly: a staging or temporary name (`step-000010.tmp`,
`step-000010.e3.staged`) is never taken for one."""


class CheckpointWriteError(OSError):
    """A checkpoint or model directory that could not be written (a full disk, an I/O error):
    one line naming it and the reason (`errno` kept when known). The half-written copy is gone and
    what was written before it is intact, so the run resumes from its last checkpoint."""


def save_model_dir(policy: Policy, path: Path) -> None:
    """A loadable model directory, its weights (and config.json's `dtype`) in `policy.save_dtype`."""
    path.mkdir(parents=True, exist_ok=True)
    if _needs_cast(policy):
        assert policy.save_dtype is not None
        state = _cast_state_dict(policy.model, DTYPES[policy.save_dtype])
        policy.model.save_pretrained(path, state_dict=state, safe_serialization=True)
        # save_pretrained wrote the parameters' dtype; the file holds save_dtype (vLLM's `auto` reads it)
        config = copy.deepcopy(policy.model.config)
        config.dtype = policy.save_dtype
        config.save_pretrained(path)
    else:
        policy.model.save_pretrained(path, safe_serialization=True)
    policy.tokenizer.save_pretrained(path)
    as_umask_allows(path)


def _needs_cast(policy: Policy) -> bool:
    """Whether some floating-point weight is held in another dtype than the one it is saved in."""
    if policy.save_dtype is None:
        return False
    want = DTYPES[policy.save_dtype]
    return any(t.is_floating_point() and t.dtype != want for t in policy.model.state_dict().values())


def _cast_state_dict(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's state as CPU copies in `dtype` (floating-point tensors only). Tensors that
    share storage (an LM head tied to the embedding) stay one tensor, so `save_pretrained` still
    writes it once."""
    out: dict[str, torch.Tensor] = {}
    copies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            out[name] = t
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if key not in copies:
            copies[key] = t.detach().to(device="cpu", dtype=dtype)
        out[name] = copies[key]
    return out


def save_model_dir_atomically(policy: Policy, path: Path) -> None:
    """A model directory (a teacher, the KL reference) written next to `path` and renamed into
    place: a write cut short (ENOSPC, a kill) never leaves a directory that looks complete,
    which a resumed run would load as it is."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model_dir(policy, tmp)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_write_failure(err):
            raise _write_failure(path, err) from err
        raise
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def _optimizer_tensors(optim: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optim.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, pstate in state["state"].items():
        for key, value in pstate.items():
            name = f"{pid}.{key}"
            if torch.is_tensor(value):
                tensors[name] = value.detach().cpu().clone().contiguous()  # a CPU copy, from any device
            else:
                scalars[name] = value
    return tensors, {"scalars": scalars, "param_groups": state["param_groups"]}


def _load_optimizer(
    optim: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    optim.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    path: Path,
    *,
    policy: Policy,
    optimizer: torch.optim.Optimizer | None,
    generator: torch.Generator,
    runner_state: dict[str, Any],
    write_shards: Callable[[Path], None] | None = None,
) -> None:
    """`optimizer` None: its state is written by `write_shards(directory)` (a sharded learner's
    ranks each write theirs), or there is none (between stages). A write that fails on the
    disk raises `CheckpointWriteError`, and nothing of it is left."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        save_model_dir(policy, tmp)
        if _needs_cast(policy) and policy.save_dtype != MASTER_DTYPE:
            # the model directory rounds the master weights: the exact ones beside it
            save_model(policy.model, str(tmp / MASTER_FILE))
        meta: dict[str, Any] | None = None
        if optimizer is not None:
            tensors, meta = _optimizer_tensors(optimizer)
            save_file(tensors, str(tmp / OPTIM_FILE))
        if write_shards is not None:
            write_shards(tmp)
        save_file(
            {"generator": generator.get_state(), "torch_cpu": torch.get_rng_state()},
            str(tmp / RNG_FILE),
        )
        (tmp / STATE_FILE).write_text(json.dumps({"runner": runner_state, "optimizer": meta}, indent=1))
        # last, once every file is there (`write_shards` returns when every rank's shards are)
        write_manifest(tmp)
    except BaseException as err:  # e.g. ENOSPC: the half-written `.tmp` goes, the last checkpoint stays
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_write_failure(err):
            raise _write_failure(path, err) from err
        raise
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def load_checkpoint_state(
    path: Path, *, optimizer: torch.optim.Optimizer | None, generator: torch.Generator
) -> dict[str, Any]:
    """Restore optimizer (None: leave it fresh) and RNG state (the weights are loaded by the
    trainer's `load(path)`, master weights included)."""
    blob = json.loads((path / STATE_FILE).read_text())
    if optimizer is not None:
        _load_optimizer(optimizer, load_file(str(path / OPTIM_FILE)), blob["optimizer"])
    rng = load_file(str(path / RNG_FILE))
    _set_generator_state(generator, rng["generator"])
    torch.set_rng_state(rng["torch_cpu"])
    return blob["runner"]


def _set_generator_state(generator: torch.Generator, state: torch.Tensor) -> None:
    """The saved sampling stream; saved on another device type (a CPU run resumed on a GPU or
    back), whose state does not fit this generator, the generator is seeded from it instead:
    still deterministic, but not the stream the other device would have drawn."""
    if state.numel() == generator.get_state().numel():
        generator.set_state(state)
        return
    digest = hashlib.sha256(state.numpy().tobytes()).digest()
    generator.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def read_runner_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())["runner"]


def _step_dirs(root: Path) -> list[Path]:
    """Directories named exactly as checkpoints are, oldest first (by step)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found) if p.is_dir()]


def finished_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first, unverified: a directory named `step-NNNNNN` holding the runner's
    state (a `.tmp` or staging directory is a write that was never put in place)."""
    return [p for p in _step_dirs(root) if (p / STATE_FILE).exists()]


def latest_checkpoint(root: Path) -> Path | None:
    """The newest finished checkpoint, unverified (`newest_verified_checkpoint` to resume)."""
    done = finished_checkpoints(root)
    return done[-1] if done else None


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Keep the newest `keep_last` finished checkpoints, and never the last one that verifies:
    when none of those kept does (NaN weights, a damaged file), the newest older one that does is
    kept too. Checked without the checksums (sizes, weights and optimizer state read back: what
    a checkpoint just written can be wrong in)."""
    done = finished_checkpoints(root)
    kept, old = done[-keep_last:], done[:-keep_last]
    if not old:
        return
    if not any(verify_checkpoint(p, checksums=False) is None for p in reversed(kept)):
        fallback = next((p for p in reversed(old) if verify_checkpoint(p, checksums=False) is None), None)
        old = [p for p in old if p != fallback]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)


# --------------------------------------------------------------------------- integrity


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(directory: Path) -> list[str]:
    """Every file under `directory` but the manifest, as sorted relative POSIX paths."""
    out = [p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()]
    return sorted(f for f in out if f != MANIFEST_FILE)


def _hashes(directory: Path, names: list[str]) -> dict[str, str]:
    """sha256 of each file, several at once (hashlib lets go of the GIL on large buffers)."""
    workers = max(1, min(4, os.cpu_count() or 1, len(names)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(names, pool.map(lambda n: _sha256(directory / n), names), strict=True))


def write_manifest(directory: Path) -> None:
    """`MANIFEST_FILE` over every other file in `directory` (written last, flushed to disk)."""
    names = _files(directory)
    hashes = _hashes(directory, names)
    files = {n: {"bytes": (directory / n).stat().st_size, "sha256": hashes[n]} for n in names}
    text = json.dumps({"version": MANIFEST_VERSION, "hash": "sha256", "files": files}, indent=1)
    with (directory / MANIFEST_FILE).open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _manifest_problem(path: Path, checksums: bool) -> str | None:
    """Why `path`'s files do not match its manifest (None: they do)."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        want = {str(name): (int(e["bytes"]), str(e["sha256"])) for name, e in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{MANIFEST_FILE} cannot be read ({_first_line(err)})"
    for name, (size, _) in want.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing (the manifest lists it)"
        if (found := file.stat().st_size) != size:
            return f"{name} is {found:,} bytes, manifest says {size:,}"
    if checksums:
        try:
            hashes = _hashes(path, list(want))
        except OSError as err:
            return f"{Path(err.filename or '?').name} cannot be read ({_first_line(err)})"
        for name, digest in hashes.items():
            if digest != want[name][1]:
                return f"{name} does not match its checksum in the manifest"
    return None


def _float_tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The floating-point tensors of a safetensors file, one at a time."""
    with safe_open(str(file), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            t = f.get_tensor(name)
            if t.is_floating_point():
                yield name, t


def _not_finite(file: Path) -> str | None:
    for name, t in _float_tensors(file):
        # a sum is many times faster than `isfinite(t).all()` and is NaN or inf with any element;
        # only then is every element looked at (a sum may also overflow)
        if not bool(torch.isfinite(t.sum(dtype=torch.float32))) and not bool(torch.isfinite(t).all()):
            what = "NaN" if bool(torch.isnan(t).any()) else "inf"
            return f"{file.name}: {name} holds {what}"
    return None


def _zeroed_optimizer(path: Path, runner: dict[str, Any]) -> str | None:
    """An optimizer state of zeros (moments and step counts) where the stage has taken steps:
    every AdamW state counts at least one step, so such a file is a damaged one."""
    file = path / OPTIM_FILE
    steps = runner.get("stage_step", 0) if runner.get("stage_started") else 0
    if not steps or not file.exists():
        return None
    seen = False
    for _, t in _float_tensors(file):
        seen = True
        if bool(t.any()):
            return None
    if not seen:  # no state at all: every update of the stage was skipped
        return None
    return f"{OPTIM_FILE} is all zeros, but the runner state says {steps} steps were taken"


def _content_problem(path: Path) -> str | None:
    """Why `path`'s contents cannot be resumed from: unreadable state, weights that are not
    finite, a zeroed optimizer (None: none of these)."""
    try:
        blob = json.loads((path / STATE_FILE).read_text())
        runner = blob["runner"]
        if not isinstance(runner, dict):
            raise TypeError("no runner state")
    except FileNotFoundError:
        return f"{STATE_FILE} is missing"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{STATE_FILE} cannot be read ({_first_line(err)})"
    weights = sorted(path.glob("model*.safetensors"))
    if not weights:
        return "it holds no model*.safetensors"
    sharded = (path / DCP_DIR).is_dir()
    if blob.get("optimizer") is not None and not sharded and not (path / OPTIM_FILE).exists():
        return f"{OPTIM_FILE} is missing"
    if not (path / RNG_FILE).exists():
        return f"{RNG_FILE} is missing"
    file = path / RNG_FILE
    try:
        for file in [*weights, path / MASTER_FILE, path / OPTIM_FILE]:
            if file.exists() and (problem := _not_finite(file)) is not None:
                return problem
        if (problem := _zeroed_optimizer(path, runner)) is not None:
            return problem
        file = path / RNG_FILE
        if set(load_file(str(file))) != {"generator", "torch_cpu"}:
            return f"{RNG_FILE} lacks the RNG states"
    except (OSError, SafetensorError) as err:
        return f"{file.name} cannot be read ({_first_line(err)})"
    return None


def verify_checkpoint(path: Path, *, checksums: bool = True) -> str | None:
    """Why `path` cannot be resumed from, in a few words naming the file (None: it can). Its
    files match the manifest (sizes always; sha256 when `checksums`), then the state reads, the
    weights (model, master, optimizer) are finite and the optimizer state is not zeroed. A
    checkpoint without a manifest (written before checksums) is judged by the second part only.
    The `dcp/` shards of a sharded checkpoint are checked against the manifest, not read."""
    if (path / MANIFEST_FILE).exists():
        problem = _manifest_problem(path, checksums)
        if problem is not None:
            return problem
    return _content_problem(path)


def model_dir_problem(path: Path) -> str | None:
    """Why `path` is not a loadable model directory (a teacher's, a KL reference's: written
    without a manifest), in a few words naming the file (None: it is): its `config.json` reads
    as JSON, it holds `model*.safetensors` and their weights are finite."""
    if not path.is_dir():
        return "it does not exist"
    try:
        json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        return "config.json is missing"
    except (OSError, ValueError) as err:
        return f"config.json cannot be read ({_first_line(err)})"
    weights = sorted(path.glob("model*.safetensors"))
    if not weights:
        return "it holds no model*.safetensors"
    file = weights[0]
    try:
        for file in weights:
            if (problem := _not_finite(file)) is not None:
                return problem
    except (OSError, SafetensorError) as err:
        return f"{file.name} cannot be read ({_first_line(err)})"
    return None


def newest_verified_checkpoint(root: Path, log: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint under `root` that verifies (`verify_checkpoint`), newest first; the
    ones skipped, and why, in one log line. None when `root` holds no checkpoint; `RunDirError`
    (one line, naming the damaged files) when it holds some and none verifies."""
    found = _step_dirs(root)
    skipped: list[str] = []
    for path in reversed(found):
        problem = verify_checkpoint(path)
        if problem is not None:
            skipped.append(f"{path.name}: {problem}")
            continue
        notes = [f"{s}: skipped" for s in skipped]
        if not (path / MANIFEST_FILE).exists():
            notes.append(
                f"{path.name} has no {MANIFEST_FILE} (written before checksums), its files read back"
            )
        if notes:
            log("; ".join([*notes, f"resuming from {path.name}"]))
        return path
    if not found:
        return None
    raise RunDirError(
        f"no checkpoint in {root} verifies ({'; '.join(skipped)}): restore one, or start over with --fresh"
    )


# --------------------------------------------------------------------------- write failures


def write_text_atomically(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file beside it, flushed and renamed: a write cut
    short leaves `path` as it was."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _is_write_failure(err: BaseException) -> bool:
    """An error of the disk under a write (ENOSPC, EIO, ...), not of the code: an OSError,
    safetensors' own error, or a failure of some rank's `torch.distributed.checkpoint` save."""
    return isinstance(err, OSError | SafetensorError | CheckpointException)


def _io_reason(err: BaseException) -> tuple[int | None, str]:
    """(errno when known, the reason in a few words)."""
    if isinstance(err, CheckpointException):
        for rank, (exc, _) in sorted(err.failures.items()):
            code, reason = _io_reason(exc)
            if "unexpected pos" in reason:  # torch.save's stream cut short: a disk that filled
                reason = "a shard's write came up short"
            return code, f"rank {rank}: {reason}"
        return None, _first_line(err)
    if isinstance(err, OSError) and err.errno is not None:
        return err.errno, err.strerror or os.strerror(err.errno)
    text = _first_line(err)
    if isinstance(err, SafetensorError) and (m := re.search(r"os error (\d+)", text)):
        return int(m.group(1)), os.strerror(int(m.group(1)))
    return None, text


def _write_failure(path: Path, err: BaseException) -> CheckpointWriteError:
    code, reason = _io_reason(err)
    name = path.name
    if (m := CHECKPOINT_NAME.match(name)) is not None:  # `step-000010.e3.staged`: the step's name
        name = m.group(0)
    where = path.parent / name
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 2**20:,.0f} MiB free on its disk"
    except OSError:
        free = ""
    out = CheckpointWriteError(f"{where} could not be written: {reason}{free}")
    out.errno = code if code is not None else errno.EIO
    return out

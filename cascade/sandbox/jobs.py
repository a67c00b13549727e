"""Runs untrusted Python programs against tests with time, memory, output and process limits.

`run_jobs(jobs, limits, backend=...)` is the one entry point; identical jobs run once, and a
job the sandbox never reports comes back as `infra_error`, never as a reward of 0.

Backends:
- `bwrap` (the sandbox; `cascade.sandbox.pool`): warm bubblewrap workers started as a
  non-root uid; per execution a program process forked from a clean zygote into fresh
  namespaces under a seccomp filter, holding only its code and the test inputs, and a judge
  in another process that compares (see `cascade.sandbox.nsworker`). What it needs from the
  host is checked when the first pool starts (`SandboxUnavailable` says what is missing).
- `auto`: the same. It never falls back: without bubblewrap a code reward refuses to run
  (`SandboxUnavailable`) unless the config says `process`.
- `process` (NOT a security boundary; only when the config asks for it, with one loud warning
  per process): ONE harness subprocess per call (`python -I -S harness.py`) forks one
  rlimited child per program, as a throwaway uid when run as root. The program shares the
  test driver's process (it can read the expected outputs and forge its report), reads the
  host filesystem and has the network.

Test forms: `{"input": x, "output": y}` calls `entry_point(x)`; `{"args": [...], "output": y}`
calls `entry_point(*args)`; `{"stdin": s, "stdout": t}` runs the program with `s` on stdin and
compares its stdout (trailing whitespace ignored). Programs get the standard library only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from cascade.sandbox import harness as harness_module
from cascade.sandbox.harness import (
    INFRA_ERROR,
    MEMORY_LIMIT,
    OK,
    OUTPUT_LIMIT,
    PARSE_ERROR,
    RUNTIME_ERROR,
    TIMEOUT,
    WRONG_ANSWER,
    SandboxLimits,
    clean_text,
    kill_group,
    passed_indices,
)
from cascade.sandbox.pool import BwrapSettings, SandboxUnavailable, shared_pool

__all__ = [
    "BwrapSettings",
    "INFRA_ERROR",
    "MEMORY_LIMIT",
    "OK",
    "OUTPUT_LIMIT",
    "PARSE_ERROR",
    "RUNTIME_ERROR",
    "TIMEOUT",
    "WRONG_ANSWER",
    "ExecResult",
    "Job",
    "SandboxLimits",
    "run_jobs",
]

Backend = Literal["auto", "bwrap", "process"]
log = logging.getLogger(__name__)

HARNESS = Path(harness_module.__file__)
"""Run as a script by the `process` backend (stdlib only: no package on its path)."""


@dataclass(frozen=True)
class Job:
    code: str
    tests: Sequence[Mapping[str, Any]]
    entry_point: str | None = None
    """Function to call for `input`/`args` tests; None when every test is stdin/stdout."""
    stop_on_failure: bool = True
    """Stop at the first failing test (all-pass scoring); False runs them all (pass fraction)."""


@dataclass(frozen=True)
class ExecResult:
    status: str
    """`ok` when every test passed, else the first failure's reason."""
    passed: int
    total: int
    detail: str = ""
    seconds: float = 0.0
    passed_tests: tuple[int, ...] = ()
    """Indices (into the job's tests) of the tests passed; `passed` is their number."""


def run_jobs(
    jobs: Sequence[Job],
    limits: SandboxLimits,
    *,
    workers: int = 2,
    overall_timeout_s: float | None = None,
    backend: Backend = "process",
    settings: BwrapSettings | None = None,
) -> list[ExecResult]:
    """Run `jobs`; identical jobs run once. Never raises for bad programs.

    `overall_timeout_s` bounds the `process` backend's harness; the `bwrap` pool bounds each
    job by its own limits instead. Raises `SandboxUnavailable` for `bwrap` on a host that
    cannot run it.
    """
    if not jobs:
        return []
    unique: dict[str, int] = {}
    payload_jobs: list[dict[str, Any]] = []
    index_of: list[int] = []
    for job in jobs:
        record = {
            "code": job.code,
            "tests": [dict(t) for t in job.tests],
            "entry_point": job.entry_point,
            "stop_on_failure": job.stop_on_failure,
        }
        key = json.dumps(record, sort_keys=True)
        if key not in unique:
            unique[key] = len(payload_jobs)
            payload_jobs.append(record)
        index_of.append(unique[key])
    if resolve_backend(backend, workers, settings) == "bwrap":
        pool = shared_pool(max(1, workers), settings)
        records = pool.run([{**job, "limits": asdict(limits)} for job in payload_jobs])
        results = [_exec_result(r) for r in records]
        return [results[i] for i in index_of]
    if overall_timeout_s is None:
        rounds = math.ceil(len(payload_jobs) / max(1, workers))
        overall_timeout_s = 30.0 + rounds * (limits.time_limit_s + 0.5) * 1.5
    payload = {"limits": asdict(limits), "workers": workers, "jobs": payload_jobs}
    results = _run_harness(payload, len(payload_jobs), overall_timeout_s)
    return [results[i] for i in index_of]


_warned_process = False
NOT_A_BOUNDARY = (
    "CODE REWARD WITHOUT A SANDBOX: `sandbox: process` runs every program in the plain-process "
    "harness, which is NOT a security boundary: a program can read its tests' expected outputs, "
    "forge its verdict, read the host's files and use the network. Use it only on a trusted "
    "machine for trusted programs; training a policy on it teaches the policy to cheat."
)


def resolve_backend(backend: Backend, workers: int = 2, settings: BwrapSettings | None = None) -> str:
    """`bwrap` for `auto` and `bwrap` (starting the shared pool; `SandboxUnavailable` when this
    host cannot run it: never a silent fallback); `process` only when asked for, with one loud
    warning per process."""
    global _warned_process
    if backend == "process":
        if not _warned_process:
            _warned_process = True
            log.warning(NOT_A_BOUNDARY)
        return "process"
    try:
        shared_pool(max(1, workers), settings)
    except SandboxUnavailable as err:
        raise SandboxUnavailable(
            f"{err}\nThe code reward refuses to run without the bubblewrap sandbox "
            f"(sandbox: {backend}). Install bubblewrap (scripts/ensure-sandbox.sh), or set "
            "`sandbox: process` in the code reward's config to run programs unsandboxed "
            "(NOT a security boundary)."
        ) from None
    return "bwrap"


def _exec_result(record: dict[str, Any]) -> ExecResult:
    total = int(record.get("total", 0))
    passed = passed_indices(record.get("passed_tests"), total)
    return ExecResult(
        clean_text(record.get("status", INFRA_ERROR), 64),
        int(record.get("passed", 0)),
        total,
        clean_text(record.get("detail", "")),
        float(record.get("seconds", 0.0)),
        tuple(passed),
    )


def _run_harness(payload: dict[str, Any], n: int, timeout_s: float) -> list[ExecResult]:
    # One directory per harness run, removed here whatever happens to the harness; each job gets
    # a fresh private directory inside it (0o711: a job can reach its own, not list the others).
    workdir = tempfile.mkdtemp(prefix="cascade-sbx-")
    try:
        os.chmod(workdir, 0o711)
        data = json.dumps({**payload, "workdir": workdir}).encode()
        return _communicate(data, n, timeout_s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _communicate(data: bytes, n: int, timeout_s: float) -> list[ExecResult]:
    results: list[ExecResult | None] = [None] * n
    failure = ""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(HARNESS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as start_error:
        return [ExecResult(INFRA_ERROR, 0, 0, f"cannot start sandbox harness: {start_error}")] * n
    try:
        out, errors = proc.communicate(data, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, errors = proc.communicate()
        failure = f"sandbox harness exceeded {timeout_s:.0f}s and was killed"
    for line in out.splitlines():
        try:
            record = json.loads(line)
            results[record["i"]] = _exec_result(record)
        except (ValueError, KeyError, IndexError, TypeError):
            failure = failure or f"bad harness output line {line[:100]!r}"
    if not failure and proc.returncode != 0:
        tail = errors.decode(errors="replace").strip().splitlines()[-1:] or [""]
        failure = f"sandbox harness exited with {proc.returncode}: {tail[0][:200]}"
    failure = failure or "sandbox harness did not report this job"
    return [r if r is not None else ExecResult(INFRA_ERROR, 0, 0, failure) for r in results]

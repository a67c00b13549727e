"""Benchmark: code-test executions/s of the bubblewrap sandbox against naive alternatives.

Measured side by side in one run, two workers each (this machine has 2 cores):
- `sandbox_bwrap`: `run_jobs(..., backend="bwrap")`, the warm bubblewrap pool;
- `sandbox_process`: the plain-process harness (one interpreter per batch, a fork per program);
- `naive_subprocess`: `subprocess.run([python, file])` per test, the program plus a one-test
  driver written to a file (what many RL verifiers do);
- `bare_spawn`: `subprocess.run(["/bin/true"])`, the floor for anything that starts a process.

An "execution" is one test of one program. Programs: `trivial` (one-line function, one test)
and `realistic` (a sieve and a sort over ~1000 numbers, 5 tests). The corpus under
`tests/security/corpus` is run through the same pool and counted as contained when every
program ends with its expected reason.

Usage: `.venv/bin/python bench/reward_code.py [--seconds S]`; merges its figures into
`bench/results/reward.json` (key `code`, plus `code_speedup_vs_naive_subprocess`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cascade.sandbox.jobs import Job, SandboxLimits, run_jobs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "reward.json"
CORPUS = ROOT / "tests" / "security" / "corpus"
WORKERS = 2
LIMITS = SandboxLimits(time_limit_s=2.0, memory_mb=256, max_output_bytes=65536, max_processes=16)

TRIVIAL = ("def f(x):\n    return x + 1\n", [{"input": 3, "output": 4}])
REALISTIC_CODE = """
def f(n):
    sieve = [True] * (n + 1)
    sieve[0:2] = [False, False]
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = [False] * len(sieve[i * i :: i])
    primes = [i for i, p in enumerate(sieve) if p]
    return sum(sorted(primes, key=lambda p: (p % 7, -p))[:10])
"""


def _realistic_tests() -> list[dict[str, int]]:
    namespace: dict[str, object] = {}
    exec(REALISTIC_CODE, namespace)
    f = namespace["f"]
    assert callable(f)
    return [{"input": n, "output": f(n)} for n in (1000, 1500, 2000, 2500, 3000)]


def _naive_one(python: str, code: str, test: dict[str, int], workdir: Path, index: int) -> bool:
    path = workdir / f"prog{index}.py"
    path.write_text(f"{code}\nimport json\nprint(json.dumps(f({test['input']!r})))\n")
    done = subprocess.run([python, str(path)], capture_output=True, timeout=LIMITS.time_limit_s)
    return done.returncode == 0 and json.loads(done.stdout) == test["output"]


def _rate(run: Callable[[], int], seconds: float) -> float:
    """Executions per second of repeated `run()` calls (each returns how many it did) for ~`seconds`."""
    run()  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += run()
    return done / (time.perf_counter() - start)


def measure(kind: str, code: str, tests: list[dict[str, int]], seconds: float) -> dict[str, float]:
    batch = 64 if kind == "trivial" else 16
    jobs = [Job(f"{code}# {i}\n", tests, "f") for i in range(batch)]  # distinct, so none is deduplicated

    def sandbox(backend: str) -> Callable[[], int]:
        def run() -> int:
            results = run_jobs(jobs, LIMITS, workers=WORKERS, backend=backend)  # type: ignore[arg-type]
            assert all(r.status == "ok" for r in results), results[:2]
            return batch * len(tests)

        return run

    python = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="cascade-bench-"))

    def naive() -> int:
        with ThreadPoolExecutor(WORKERS) as pool:
            calls = list(enumerate(t for _ in range(batch) for t in tests))
            ok = list(pool.map(lambda it: _naive_one(python, code, it[1], workdir, it[0]), calls))
        assert all(ok)
        return len(ok)

    def bare() -> int:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda _: subprocess.run(["/bin/true"]), range(batch)))
        return batch

    return {
        "sandbox_bwrap": _rate(sandbox("bwrap"), seconds),
        "sandbox_process": _rate(sandbox("process"), seconds),
        "naive_subprocess": _rate(naive, seconds),
        "bare_spawn": _rate(bare, seconds),
    }


def corpus_contained() -> dict[str, int]:
    programs = sorted(CORPUS.glob("*.py"))
    limits = SandboxLimits(time_limit_s=1.0, memory_mb=256, max_output_bytes=4096, max_processes=8)
    tests = [{"input": 1, "output": 2}, {"input": 5, "output": 6}]
    jobs = [Job(p.read_text(), tests, "f") for p in programs]
    results = run_jobs(jobs, limits, workers=WORKERS, backend="bwrap")
    expected = [p.read_text().splitlines()[0].removeprefix("# expect: ").strip() for p in programs]
    return {
        "programs": len(programs),
        "contained": sum(r.status == e for r, e in zip(results, expected, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time per measurement")
    args = parser.parse_args()
    figures = {
        "trivial": measure("trivial", *TRIVIAL, args.seconds),
        "realistic": measure("realistic", REALISTIC_CODE, _realistic_tests(), args.seconds),
    }
    code = {kind: {k: round(v, 1) for k, v in rates.items()} for kind, rates in figures.items()}
    trivial = figures["trivial"]
    summary = {
        "code": {
            **code,
            "unit": "test executions per second, 2 workers",
            "workers": WORKERS,
            "corpus": corpus_contained(),
        },
        "code_speedup_vs_naive_subprocess": round(trivial["sandbox_bwrap"] / trivial["naive_subprocess"], 2),
        "code_speedup_vs_naive_subprocess_realistic": round(
            figures["realistic"]["sandbox_bwrap"] / figures["realistic"]["naive_subprocess"], 2
        ),
        "code_bwrap_vs_bare_spawn": round(trivial["sandbox_bwrap"] / trivial["bare_spawn"], 2),
    }
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing.update(summary)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

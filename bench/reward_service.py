"""Benchmark: verifications/s through the reward service against the same verifier in-process.

Starts a real gRPC front and one Celery worker (local Redis, db 12, flushed before and after)
as subprocesses, then scores the same answers (half right, half wrong) three ways, in one run:
- math: raw `math_verify` calls in this process, `MathDomain.score_batch` in this process,
  and `Score` RPCs to the front (math is scored in the front's math-verify worker process);
- code: `CodeDomain.score_batch` with the bubblewrap sandbox in this process, and `Score` RPCs
  (code goes front -> Redis -> Celery worker -> sandbox pool).

Usage: `.venv/bin/python bench/reward_service.py [--n N]`; merges its figures into
`bench/results/reward.json` (key `service`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import redis

from cascade.config import DomainConfig
from cascade.domains import Problem, make_domain
from cascade.transport.health import wait_until_serving
from cascade_proto.v1 import reward_pb2 as pb
from cascade_proto.v1 import reward_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "reward.json"
BROKER = "redis://127.0.0.1:6379/12"
BATCH = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "CASCADE_REWARD_BROKER_URL": BROKER, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_log(log: Path, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {text!r} in {log}:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)


def answers(domain: str, n: int) -> tuple[list[Problem], list[str]]:
    # A domain's generator has a finite number of distinct problems (code: ~1600), so problems
    # repeat past it; the completions below stay distinct, so no verdict cache applies.
    distinct = make_domain(DomainConfig(name=domain)).make_problems("eval", min(n, 1024), 0)  # type: ignore[arg-type]
    problems = [distinct[i % len(distinct)] for i in range(n)]
    wrong = {"math": "The answer is \\boxed{-7}.", "code": "```python\ndef f(x):\n    return -7\n```"}[domain]
    # Every completion distinct (verdict caches and batch deduplication never apply).
    if domain == "math":
        return problems, [f"Try {i}: " + (p.answer if i % 2 == 0 else wrong) for i, p in enumerate(problems)]
    tag = "```python\n# try {i}\n"
    return problems, [
        (
            f"```python\n{p.answer}\n# try {i}\n```"
            if i % 2 == 0
            else wrong.replace("```python\n", tag.format(i=i))
        )
        for i, p in enumerate(problems)
    ]


def _rate(n: int, warm: Callable[[], object], run: Callable[[], object]) -> float:
    """Answers/s of `run()` after `warm()` (the same way on other answers: worker processes,
    sandbox pools and connections started, but no verdict cached for what is measured)."""
    warm()
    start = time.perf_counter()
    run()
    return n / (time.perf_counter() - start)


def _rpc_scorer(
    stub: pb_grpc.RewardServiceStub, domain: str, problems: Sequence[Problem], completions: list[str]
):
    items = [
        pb.Item(
            problem=pb.Problem(id=p.id, prompt=p.prompt, answer=p.answer, meta_json=json.dumps(p.meta)),
            completion=c,
        )
        for p, c in zip(problems, completions, strict=True)
    ]

    def run() -> None:
        for start in range(0, len(items), BATCH):
            reply = stub.Score(
                pb.ScoreRequest(domain=domain, items=items[start : start + BATCH]), timeout=300
            )
            assert all(v.reason != "infra_error" for v in reply.verdicts), reply.verdicts[0]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="answers per domain")
    args = parser.parse_args()
    redis.Redis.from_url(BROKER).flushdb()
    logs = Path(tempfile.mkdtemp(prefix="cascade-bench-reward-"))
    port, metrics_port = _free_port(), _free_port()
    front_argv = [sys.executable, "-m", "services.reward.main", "--host", "127.0.0.1", "--port", str(port)]
    front_argv += ["--metrics-port", str(metrics_port), "--broker-url", BROKER]
    worker_argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "services.reward.tasks",
        "worker",
        "--concurrency",
        "1",
    ]
    worker_argv += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]
    results: dict[str, dict[str, float]] = {}
    with _process(front_argv, logs / "front.log"), _process(worker_argv, logs / "worker.log"):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        why = wait_until_serving(f"127.0.0.1:{port}", timeout_s=60)
        if why is not None:
            raise RuntimeError(
                f"reward front {why} before serving:\n{(logs / 'front.log').read_text()[-2000:]}"
            )
        _wait_log(logs / "worker.log", "ready.")
        stub = pb_grpc.RewardServiceStub(channel)

        # Verdict caches are keyed by (gold, answer): each pass uses fresh problems so that no
        # way is measured on answers it has already seen.
        math_domain = make_domain(DomainConfig(name="math"))
        from math_verify import parse, verify

        pool = {"math": answers("math", args.n * 6), "code": answers("code", args.n * 4)}

        def fresh(domain: str, offset: int) -> tuple[list[Problem], list[str]]:
            problems, completions = pool[domain]
            part = slice(offset * args.n, (offset + 1) * args.n)
            return problems[part], completions[part]

        def raw_verify(offset: int) -> Callable[[], object]:
            problems, completions = fresh("math", offset)
            return lambda: [
                verify(parse(f"${p.answer}$"), parse(c)) for p, c in zip(problems, completions, strict=True)
            ]

        def in_process(domain: object, name: str, offset: int) -> Callable[[], object]:
            problems, completions = fresh(name, offset)
            return lambda: domain.score_batch(problems, completions)  # type: ignore[attr-defined]

        def rpc(name: str, offset: int) -> Callable[[], None]:
            return _rpc_scorer(stub, name, *fresh(name, offset))

        results["math"] = {
            "raw_math_verify": _rate(args.n, raw_verify(0), raw_verify(1)),
            "in_process_domain": _rate(
                args.n, in_process(math_domain, "math", 2), in_process(math_domain, "math", 3)
            ),
            "service": _rate(args.n, rpc("math", 4), rpc("math", 5)),
        }
        code_domain = make_domain(
            DomainConfig.model_validate({"name": "code", "reward": {"kind": "code", "sandbox": "bwrap"}})
        )
        results["code"] = {
            "in_process_bwrap": _rate(
                args.n, in_process(code_domain, "code", 0), in_process(code_domain, "code", 1)
            ),
            "service_celery_bwrap": _rate(args.n, rpc("code", 2), rpc("code", 3)),
        }
        channel.close()
    redis.Redis.from_url(BROKER).flushdb()
    service_figures = {
        domain: {k: round(v, 1) for k, v in rates.items()} for domain, rates in results.items()
    }
    summary = {
        "service": {
            **service_figures,
            "unit": "answers scored per second (code: 6 tests each); 1 front, 1 Celery worker process",
            "n": args.n,
        },
        "math_service_vs_in_process": round(
            results["math"]["service"] / results["math"]["in_process_domain"], 2
        ),
        "code_service_vs_in_process": round(
            results["code"]["service_celery_bwrap"] / results["code"]["in_process_bwrap"], 2
        ),
    }
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing.update(summary)
    RESULTS.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

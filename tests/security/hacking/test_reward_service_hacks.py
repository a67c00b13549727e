"""Reward hacking through the reward service: every corpus, scored as a remote trainer scores it.

Each `corpus_<domain>.py` beside this file (found by glob, so a new corpus joins on its own) is
sent through the gRPC reward service: a real front (`python -m services.reward.main`) and a
real Celery worker (one process, so two programs do not share the cores their time budgets
assume) over the local Redis (database 12, flushed before and after), as the integration
tests start them. Per reward config, one request holds the corpus's hostile CASES and then
its RIGHT ones, as its domain test scores them in one batch: every hostile case gets
a fair verdict that pays at most its cap and is never `infra_error`, and every right one earns
its reward after them. The front scores math, if and execution-free swe in its worker
processes; code, rlhf and execution swe go to the Celery worker (code in the sandbox).

Cases the service cannot score here are skipped with the reason (rlhf without its model).
Skipped when Redis is unreachable, unless CASCADE_REQUIRE_REDIS=1.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from hostile_cases import HostileCase, RightCase, failures

from cascade_proto.v1 import reward_pb2 as pb
from cascade_proto.v1 import reward_pb2_grpc as pb_grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "integration"))  # the service's process helpers

from reward_procs import REDIS, Front, Proc, flush_or_skip, redis_client, start_worker  # noqa: E402

pytestmark = pytest.mark.timeout(900)

CORPORA = sorted(path.stem for path in HERE.glob("corpus_*.py"))
DB = 12
RPC_TIMEOUT_S = 600


def _redis() -> Any:
    return redis_client(DB)


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pb_grpc.RewardServiceStub]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed (the worker scores code only in the sandbox)")
    flush_or_skip(DB)
    log_dir = tmp_path_factory.mktemp("reward-service-hacks")
    url = f"redis://{REDIS}/{DB}"
    procs: list[Proc | Front] = []
    try:
        worker = start_worker("hacks-worker", url, log_dir, concurrency=1)
        procs.append(worker)
        front = Front("hacks-front", url, log_dir, "--task-timeout-s", str(RPC_TIMEOUT_S - 30))
        procs.append(front)
        worker.wait_for_log("ready.", 90)
        front.wait_serving(120)
        yield pb_grpc.RewardServiceStub(front.channel)
    finally:
        for proc in reversed(procs):
            proc.stop()
        _redis().flushdb()


def _unscorable(domain: str, reward_config: dict[str, Any]) -> str | None:
    """Why this service cannot score the domain here, or None."""
    if domain == "rlhf":
        path = reward_config.get("model_path")
        if not path or not Path(path, "config.json").is_file():
            return f"rlhf needs its reward model on the workers' filesystem (model_path {path!r} absent)"
    return None


def _item(case: HostileCase | RightCase) -> pb.Item:
    p = case.problem
    problem = pb.Problem(id=p.id or case.name, prompt=p.prompt, answer=p.answer, meta_json=json.dumps(p.meta))
    return pb.Item(problem=problem, completion=case.completion)


def _groups(corpus: ModuleType) -> dict[tuple[str, str], tuple[list[HostileCase], list[RightCase]]]:
    """CASES and RIGHT by (domain, reward config): one request each, in corpus order."""
    groups: dict[tuple[str, str], tuple[list[HostileCase], list[RightCase]]] = {}
    for case in corpus.CASES:
        key = (case.domain, json.dumps(case.reward_config, sort_keys=True))
        groups.setdefault(key, ([], []))[0].append(case)
    for right in corpus.RIGHT:
        key = (right.domain, json.dumps(right.reward_config, sort_keys=True))
        groups.setdefault(key, ([], []))[1].append(right)
    return groups


def test_corpora_are_found() -> None:
    assert {"corpus_math", "corpus_code"} <= set(CORPORA), CORPORA


@pytest.mark.parametrize("name", CORPORA)
def test_corpus_through_the_reward_service(name: str, stub: pb_grpc.RewardServiceStub) -> None:
    corpus = importlib.import_module(name)
    assert corpus.CASES and corpus.RIGHT, f"{name}: CASES and RIGHT must not be empty"
    scored, skipped = 0, []
    unfair: list[str] = []
    unpaid: list[str] = []
    for (domain, config), (cases, rights) in _groups(corpus).items():
        why = _unscorable(domain, json.loads(config))
        if why:
            skipped.append(f"{domain} {config}: {len(cases) + len(rights)} cases: {why}")
            continue
        request = pb.ScoreRequest(
            domain=domain, reward_config_json=config, items=[_item(c) for c in [*cases, *rights]]
        )
        try:
            reply = stub.Score(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            pytest.fail(f"{name}: {domain} {config}: {err.code().name}: {err.details()}")
        verdicts = list(reply.verdicts)
        assert [v.index for v in verdicts] == list(range(len(cases) + len(rights)))
        unfair += [f"{domain} {config}: {line}" for line in failures(cases, verdicts[: len(cases)])]
        for right, v in zip(rights, verdicts[len(cases) :], strict=True):
            if v.reason == "infra_error" or abs(v.reward - right.reward) > 1e-6:
                unpaid.append(f"{right.name}: {v.reward} {v.reason} {v.detail[:200]!r}")
        scored += len(cases) + len(rights)
    assert unfair == [], f"{name}: hostile cases paid, unfairly judged or infra_error"
    assert unpaid == [], f"{name}: right answers not paid after the hostile ones"
    if not scored:
        pytest.skip("; ".join(skipped))

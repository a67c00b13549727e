"""The reward service answers every well-formed Score with one verdict per item: an item whose
verifier raises, or whose verdict text is poisoned, gets its own verdict and its neighbours keep
theirs. In process (the servicer over a real Dispatcher and DomainCache, a fake verifier); the
integration tests do the same through gRPC, Celery and the sandbox."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from cascade.config import DomainConfig
from cascade.domains.base import INFRA_ERROR, OK, TIMEOUT, WRONG_ANSWER, Problem, RewardVerdict
from cascade.sandbox.jobs import SandboxLimits
from cascade.tools.builtin import PythonTool
from cascade_proto.v1 import reward_pb2 as pb
from services.reward.batch import Batch, DomainCache, domain_key
from services.reward.budget import score_each
from services.reward.local import InProcess
from services.reward.metrics import RewardMetrics
from services.reward.scoring import DispatchConfig, Dispatcher
from services.reward.server import RewardServicer, _verdict


class Fussy:
    """Raises on a whole batch holding "raise", and on that item alone; echoes the rest raw."""

    name = "math"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return []

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        self.calls.append(len(completions))
        if any("raise" in c for c in completions):
            raise RuntimeError("verifier bug \ud800\x1b[2J")
        return [
            RewardVerdict(1.0, OK) if c == "right" else RewardVerdict(0.0, WRONG_ANSWER, f"got {c}")
            for c in completions
        ]


class Context:
    def is_active(self) -> bool:
        return True

    def time_remaining(self) -> float | None:
        return None

    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


@pytest.fixture
def servicer() -> tuple[RewardServicer, Fussy]:
    config = DomainConfig(name="math")
    cache = DomainCache()
    fussy = Fussy()
    cache._domains[domain_key(config)] = fussy  # type: ignore[assignment]
    dispatcher = Dispatcher(DispatchConfig(remote_domains=frozenset()), None, InProcess(cache))  # type: ignore[arg-type]
    return RewardServicer(dispatcher, RewardMetrics()), fussy


def _request(completions: list[str]) -> pb.ScoreRequest:
    return pb.ScoreRequest(
        domain="math",
        items=[
            pb.Item(problem=pb.Problem(id=f"p{i}", prompt="q", answer="1"), completion=c)
            for i, c in enumerate(completions)
        ],
    )


POISON = "\x00\x1b[2J\u202e-999"


def test_one_raising_item_gets_its_own_infra_error(servicer: tuple[RewardServicer, Fussy]) -> None:
    server, fussy = servicer
    reply = server.Score(_request(["right", "raise", POISON, "right"]), Context())  # type: ignore[arg-type]
    got = [(v.index, v.problem_id, v.reward, v.reason) for v in reply.verdicts]
    assert got == [
        (0, "p0", 1.0, OK),
        (1, "p1", 0.0, INFRA_ERROR),
        (2, "p2", 0.0, WRONG_ANSWER),
        (3, "p3", 1.0, OK),
    ]
    assert "verifier bug" in reply.verdicts[1].detail and "\x1b" not in reply.verdicts[1].detail
    assert reply.verdicts[2].detail == "got [2J-999"
    assert fussy.calls == [4, 1, 1, 1, 1]  # the batch, then item by item
    streamed = list(server.ScoreStream(_request(["raise", "right"]), Context()))  # type: ignore[arg-type]
    assert sorted((v.index, v.reason) for v in streamed) == [(0, INFRA_ERROR), (1, OK)]


def test_a_dispatcher_bug_is_infra_errors_not_a_failed_rpc(servicer: tuple[RewardServicer, Fussy]) -> None:
    server, _ = servicer

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    server.dispatcher.score = broken  # type: ignore[method-assign]
    server.dispatcher.stream = broken  # type: ignore[method-assign]
    reply = server.Score(_request(["right", "right"]), Context())  # type: ignore[arg-type]
    assert [(v.index, v.reason) for v in reply.verdicts] == [(0, INFRA_ERROR), (1, INFRA_ERROR)]
    streamed = list(server.ScoreStream(_request(["right", "right"]), Context()))  # type: ignore[arg-type]
    assert [(v.index, v.reason) for v in streamed] == [(0, INFRA_ERROR), (1, INFRA_ERROR)]


def test_a_verdict_protobuf_refuses_becomes_its_own_infra_error() -> None:
    poisoned = RewardVerdict(0.0, WRONG_ANSWER, "ok")
    object.__setattr__(poisoned, "detail", "\ud800")  # bypass the constructor's sanitising
    message = _verdict(3, "p3", poisoned)
    assert (message.index, message.problem_id, message.reason) == (3, "p3", INFRA_ERROR)
    message.SerializeToString()


def test_unsplittable_domains_are_not_rescored_item_by_item() -> None:
    config = DomainConfig(name="rlhf", reward={"kind": "rlhf", "model_path": "/nonexistent"})  # type: ignore[arg-type]
    cache = DomainCache()
    fussy = Fussy()
    cache._domains[domain_key(config)] = fussy  # type: ignore[assignment]
    problems = [Problem(id=f"p{i}", domain="rlhf", prompt="q", answer="a") for i in range(3)]
    verdicts = cache.score(Batch(config, problems, ["right", "raise", "right"]))
    assert [v.reason for v in verdicts] == [INFRA_ERROR] * 3
    assert fussy.calls == [3]


class Agentish:
    """A domain whose items run python tool calls (`slow`: three of 0.3 s each)."""

    name = "agent"

    def __init__(self) -> None:
        self.python = PythonTool(SandboxLimits(time_limit_s=2.0))

    def make_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return []

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardVerdict]:
        for c in completions:
            for _ in range(3 if c == "slow" else 0):
                self.python.run({"code": "pass"})
        return [
            RewardVerdict(1.0, OK) if c == "right" else RewardVerdict(0.0, WRONG_ANSWER) for c in completions
        ]


def test_an_item_over_its_budget_is_timeout_and_its_neighbours_are_scored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tool calls counted together against the item's budget (0.5 s: the second call of 0.3 s
    ends past it, and the episode is stopped there); the item is `timeout` with reward 0, never
    `infra_error`, and the next items get their own verdicts, each reported as it is known."""
    monkeypatch.setattr(PythonTool, "run", lambda self, arguments: time.sleep(0.3) or "")
    config = DomainConfig(name="agent")
    cache = DomainCache()
    cache._domains[domain_key(config)] = Agentish()  # type: ignore[assignment]
    problems = [Problem(id=f"p{i}", domain="agent", prompt="q", answer="a") for i in range(4)]
    heard: list[tuple[int, str]] = []
    start = time.monotonic()
    verdicts = score_each(
        cache,
        Batch(config, problems, ["right", "slow", "wrong", "right"]),
        0.5,
        lambda i, v: heard.append((i, v.reason)),
    )
    assert time.monotonic() - start < 1.5
    assert [(v.reward, v.reason) for v in verdicts] == [
        (1.0, OK),
        (0.0, TIMEOUT),
        (0.0, WRONG_ANSWER),
        (1.0, OK),
    ]
    assert "budget" in verdicts[1].detail
    assert heard == [(0, OK), (1, TIMEOUT), (2, WRONG_ANSWER), (3, OK)]
    without = score_each(cache, Batch(config, problems[1:2], ["slow"]), None)  # no budget: it runs
    assert [v.reason for v in without] == [WRONG_ANSWER]

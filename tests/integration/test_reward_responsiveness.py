"""The reward front stays responsive and fair while it scores the worst completions we can build.

A real front (`python -m services.reward.main`, two local scoring processes) as a subprocess.
While one client has it score, for each light domain, completions built to keep its verifier
busy (math: six items that each run to the math timeout, a power whose big-integer
evaluation holds the GIL for seconds and five fractions nested 500 deep; if and swe: responses
just under the length bound, shaped for the rule and patch-extraction regexes; and a
million-character one each, over the bound), a health check must answer within 1 s each
time, and a second client's two easy math items must come back right within their 20 s
deadline (behind one math worker, first come first served, they waited for all six). A
client whose deadline passes gets its verdicts, the unscored ones `infra_error` saying so,
before its deadline, and the metrics count them.

The domains the Celery workers score (code, rlhf, swe in execution mode, agent with the
python tool) never run in the front; their worst cases are in tests/security/hacking (through
the service too). The last tests hold the workers to the same: at a client's deadline the
finished items keep their verdicts (a slow one in their task or not), a second client's easy
items pass a worst batch's backlog, and an agent episode whose tool calls run past its item
budget is `timeout` while its neighbours are scored.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from reward_procs import REDIS, Front, Proc, flush_or_skip, free_port, redis_client, start_worker

from cascade.config import DomainConfig
from cascade.domains import Problem, make_domain
from cascade.domains.agent import default_format, render_trace
from cascade_proto.v1 import reward_pb2 as pb
from cascade_proto.v1 import reward_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(240)

SWE_CONFIG = {"kind": "swe", "mode": "similarity"}
"""Execution-free, so scored in the front (execution mode goes to the Celery workers)."""
HEALTH_BOUND_S = 1.0
FAIR_FLOOR = {"math": 0.0, "if": 0.0, "swe": -1.0}


def _problem(domain: str) -> Problem:
    reward = SWE_CONFIG if domain == "swe" else None
    config = DomainConfig.model_validate({"name": domain, "reward": reward})
    return make_domain(config).make_problems("eval", 1, 0)[0]


def _worst(domain: str) -> list[str]:
    """Completions built to keep `domain`'s verifier busy (distinct, so no cache helps)."""
    over_long = "x" * 1_000_000
    if domain == "math":  # six slow items, as in the issue, then the over-long one
        nested = ["\\boxed{" + "\\frac{1}{" * 500 + str(i) + "}" * 500 + "}" for i in range(1, 6)]
        return ["The answer is \\boxed{10^{10^{8}} + 1}", *nested, over_long]
    if domain == "if":
        return [
            ("word " * 6_399)[:31_990],
            ("* item\n\n" * 3_999)[:31_990],
            ("a" * 5 + " ," + "!" * 3 + "\n") * 2_900,
            over_long,
        ]
    return [  # swe: fences that never close, diff headers, hunks with no body
        ("```diff\n--- a/x\n" * 3_999)[:63_990],
        ("```\n" * 15_999)[:63_990],
        ("@@ -1 +1 @@\n-" * 4_900)[:63_990],
        over_long,
    ]


def _request(domain: str, completions: list[str], problem: Problem | None = None) -> pb.ScoreRequest:
    problem = problem or _problem(domain)
    return pb.ScoreRequest(
        domain=domain,
        reward_config_json=json.dumps(SWE_CONFIG) if domain == "swe" else "",
        items=[
            pb.Item(
                problem=pb.Problem(
                    id=f"{problem.id}-{i}",
                    prompt=problem.prompt,
                    answer=problem.answer,
                    meta_json=json.dumps(problem.meta),
                ),
                completion=c,
            )
            for i, c in enumerate(completions)
        ],
    )


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    log_dir: Path = tmp_path_factory.mktemp("reward-responsive")
    # Light domains only: the broker is never reached (a closed port).
    f = Front("responsive", f"redis://127.0.0.1:{free_port()}/0", log_dir, "--local-workers", "2")
    try:
        f.wait_serving(120)
        yield f
    finally:
        f.stop()


def _health_ms(channel: grpc.Channel) -> float:
    stub = health_pb2_grpc.HealthStub(channel)
    start = time.perf_counter()
    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_BOUND_S)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return (time.perf_counter() - start) * 1000


def _metric(front: Front, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{front.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_health_and_a_second_client_are_served_while_the_worst_is_scored(front: Front) -> None:
    hostile = pb_grpc.RewardServiceStub(front.channel)
    replies: dict[str, pb.ScoreResponse] = {}
    errors: list[BaseException] = []

    def score(domain: str) -> None:
        try:
            replies[domain] = hostile.Score(_request(domain, _worst(domain)), timeout=120)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=score, args=(d,)) for d in ("math", "if", "swe")]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the hostile batches are in the workers now
    # A second client on its own connection, as another trainer would be.
    with grpc.insecure_channel(f"127.0.0.1:{front.port}") as other:
        latencies = [_health_ms(other)]
        math = _problem("math")
        easy = _request("math", [math.answer, "The answer is \\boxed{-1}."], math)
        start = time.monotonic()
        answered = pb_grpc.RewardServiceStub(other).Score.future(easy, timeout=20)
        while not answered.done() or any(t.is_alive() for t in threads[:1]):
            latencies.append(_health_ms(other))  # raises DEADLINE_EXCEEDED past 1 s
            time.sleep(0.1)
            if time.monotonic() - start > 100:
                break
        reply = answered.result()
    assert [v.reason for v in reply.verdicts] == ["ok", "wrong_answer"]
    assert max(latencies) < HEALTH_BOUND_S * 1000, latencies
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for domain, response in replies.items():
        verdicts = response.verdicts
        assert len(verdicts) == len(_worst(domain))
        for v in verdicts:  # fair verdicts on the completions: none paid, none the service's fault
            assert v.reason != "infra_error" and v.reward <= FAIR_FLOOR[domain] + 1e-9, (domain, v)
        assert verdicts[-1].reason == "output_limit" and "response too long" in verdicts[-1].detail
    assert _metric(front, "cascade_reward_over_long_items_total", domain="math") >= 1


def test_items_left_at_the_deadline_say_so_before_it(front: Front) -> None:
    stub = pb_grpc.RewardServiceStub(front.channel)
    before = _metric(front, "cascade_reward_deadline_expired_items_total", domain="math")
    math = _problem("math")
    slow = [f"\\boxed{{10^{{10^{{8}}}} + {i}}}" for i in range(6)]
    start = time.monotonic()
    reply = stub.Score(_request("math", slow, math), timeout=4)
    assert time.monotonic() - start < 4
    reasons = [v.reason for v in reply.verdicts]
    assert "infra_error" in reasons, reasons
    for v in reply.verdicts:
        assert v.reason in {"infra_error", "timeout", "wrong_answer"}, v
        if v.reason == "infra_error":
            assert v.detail.startswith("the request's deadline passed"), v.detail
    expired = reasons.count("infra_error")
    after = _metric(front, "cascade_reward_deadline_expired_items_total", domain="math")
    assert after - before == expired
    # The workers that were on the expired items were stopped: the next request is served.
    reply = stub.Score(_request("math", [math.answer], math), timeout=20)
    assert [v.reason for v in reply.verdicts] == ["ok"]


# --------------------------------------------------------------------------- through the workers
# The same guarantees for the domains the Celery workers score (code; agent with the python
# tool): an item's verdict never depends on its neighbours. A real worker (two processes)
# over Redis db 7; "fair" is a front with the default chunking, "chunky" one with 8 items a
# task; both give each item a 4 s budget.

WORKER_DB = 7
BUDGET_S = 4.0
LOOP = "```python\nwhile True:\n    pass\n```"
AGENT_CONFIG = {"kind": "agent", "python_tool": True}


@dataclass
class Workers:
    fair: Front
    chunky: Front


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    flush_or_skip(WORKER_DB)
    log_dir: Path = tmp_path_factory.mktemp("reward-workers")
    url = f"redis://{REDIS}/{WORKER_DB}"
    budget = ("--item-timeout-s", str(BUDGET_S), "--local-workers", "1")
    procs: list[Proc | Front] = []
    try:
        worker = start_worker("fair-worker", url, log_dir, concurrency=2)
        procs.append(worker)
        fronts = [
            Front("fair", url, log_dir, *budget),
            Front("chunky", url, log_dir, "--chunk-size", "8", *budget),
        ]
        procs += fronts
        worker.wait_for_log("ready.", 60)
        for f in fronts:
            f.wait_serving(120)
        service = Workers(*fronts)
        code = _problems("code", 2)  # warm both worker processes' sandboxes
        reply = _stub(service.fair).Score(_code_request(code, [p.answer for p in code]), timeout=60)
        assert [v.reason for v in reply.verdicts] == ["ok", "ok"], reply
        yield service
    finally:
        for proc in procs:
            proc.stop()
        redis_client(WORKER_DB).flushdb()


def _stub(front: Front) -> pb_grpc.RewardServiceStub:
    return pb_grpc.RewardServiceStub(front.channel)


def _problems(domain: str, n: int, reward: dict[str, object] | None = None) -> list[Problem]:
    config = DomainConfig.model_validate({"name": domain, "reward": reward})
    return make_domain(config).make_problems("eval", n, 0)


def _items(problems: list[Problem], completions: list[str]) -> list[pb.Item]:
    return [
        pb.Item(
            problem=pb.Problem(
                id=f"{p.id}-{i}", prompt=p.prompt, answer=p.answer, meta_json=json.dumps(p.meta)
            ),
            completion=c,
        )
        for i, (p, c) in enumerate(zip(problems, completions, strict=True))
    ]


def _code_request(problems: list[Problem], completions: list[str], config: str = "") -> pb.ScoreRequest:
    return pb.ScoreRequest(domain="code", reward_config_json=config, items=_items(problems, completions))


@pytest.mark.parametrize("which", ["fair", "chunky"])
def test_finished_items_keep_their_verdicts_at_the_deadline(workers: Workers, which: str) -> None:
    """A slow item (a program looping to its 8 s limit) and easy ones under a 4 s deadline:
    the easy ones come back right, only the slow one is `infra_error` (the deadline's). With 8
    items a task, the items after the slow one in its task wait for it: only those scored
    before it are asserted there."""
    front = getattr(workers, which)
    problems = _problems("code", 4)
    completions = [problems[0].answer, "```python\ndef f(x):\n    return -999\n```", LOOP, problems[3].answer]
    if which == "fair":  # the slow item amid the easy ones
        completions = [completions[0], completions[2], completions[1], completions[3]]
    start = time.monotonic()
    config = json.dumps({"time_limit_s": 8})
    reply = _stub(front).Score(_code_request(problems, completions, config), timeout=4)
    elapsed = time.monotonic() - start
    got = [(v.reason, v.reward) for v in reply.verdicts]
    slow = completions.index(LOOP)
    expected = {0: ("ok", 1.0), 1 if slow == 2 else 2: ("wrong_answer", 0.0)}
    if which == "fair":
        expected[3] = ("ok", 1.0)
    for i, want in expected.items():
        assert got[i] == want, (i, got, reply.verdicts)
    assert reply.verdicts[slow].reason == "infra_error", reply.verdicts[slow]
    assert reply.verdicts[slow].detail.startswith("the request's deadline passed"), reply.verdicts[slow]
    assert elapsed < 4
    time.sleep(max(0.0, start + 9.5 - time.monotonic()))  # the slow program's worker is free again


def test_a_second_clients_easy_items_pass_a_worst_batch(workers: Workers) -> None:
    """One client sends 16 programs that loop to their 2 s limit; another's two easy items,
    sent a second later, come back right within 5 s (first in, first out behind 8-item tasks,
    they waited 8 s and more). The hostile ones all get their own `timeout`."""
    problems = _problems("code", 16)
    loops = [LOOP.replace("while", f"# {i}\nwhile") for i in range(16)]  # distinct: none run once for all
    hostile = _stub(workers.fair).Score.future(_code_request(problems, loops), timeout=90)
    time.sleep(1.0)
    easy = _problems("code", 2)
    with grpc.insecure_channel(f"127.0.0.1:{workers.fair.port}") as other:
        start = time.monotonic()
        reply = pb_grpc.RewardServiceStub(other).Score(
            _code_request(easy, [p.answer for p in easy]), timeout=20
        )
        latency = time.monotonic() - start
    print(f"easy items beside a worst batch: {latency:.2f}s")
    assert [(v.reason, v.reward) for v in reply.verdicts] == [("ok", 1.0), ("ok", 1.0)], reply
    assert latency < 5.0, latency
    verdicts = hostile.result(timeout=90).verdicts
    assert [v.reason for v in verdicts] == ["timeout"] * 16, verdicts


def _python_episode(problem: Problem, calls: int) -> str:
    """A transcript whose every turn runs a python program that sleeps 1.5 s (the responses
    are the environment's: the replay runs each one), then answers."""
    trace: list[dict[str, object]] = []
    for i in range(calls):
        code = f"import time\ntime.sleep(1.5)\nprint({i})"
        call = {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}
        trace += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": str(i)},
        ]
    trace.append({"role": "assistant", "content": str(problem.meta["check"].get("answer", "Done."))})
    return render_trace(trace, default_format())


def test_an_agent_episode_over_its_budget_gets_its_own_timeout(workers: Workers) -> None:
    """Four python calls of 1.5 s each run past the 4 s item budget: that episode is `timeout`
    (not `infra_error`, not its task's fate), its neighbours are scored right, on both fronts."""
    problems = _problems("agent", 3, AGENT_CONFIG)
    completions = [problems[0].answer, _python_episode(problems[1], 4), problems[2].answer]
    request = pb.ScoreRequest(
        domain="agent", reward_config_json=json.dumps(AGENT_CONFIG), items=_items(problems, completions)
    )
    for front in (workers.fair, workers.chunky):
        start = time.monotonic()
        reply = _stub(front).Score(request, timeout=60)
        elapsed = time.monotonic() - start
        got = [(v.reason, v.reward) for v in reply.verdicts]
        assert got == [("ok", 1.0), ("timeout", 0.0), ("ok", 1.0)], (front.proc.name, reply.verdicts)
        assert "budget" in reply.verdicts[1].detail
        assert elapsed < BUDGET_S + 4, elapsed

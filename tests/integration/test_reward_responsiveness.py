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

The domains the Celery workers score (code, rlhf, swe in execution mode) never run in the
front; their worst cases are in tests/security/hacking (through the service too).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from reward_procs import Front, free_port

from cascade.config import DomainConfig
from cascade.domains import Problem, make_domain
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

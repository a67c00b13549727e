"""The reward service end to end: real Redis, real Celery workers, the real gRPC front.

Every process is a subprocess on free ports (see `reward_procs`), stopped by pid at teardown.
The tests use their own Redis databases (11: the main front and worker; 13: the late-ack
test), flushed before and after. Skipped when Redis is unreachable, unless
CASCADE_REQUIRE_REDIS=1.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from reward_procs import REDIS, Front, Proc, flush_or_skip, free_port, redis_client, start_redis, start_worker

from cascade.config import DomainConfig
from cascade.domains import Problem, make_domain
from cascade.sandbox.pool import PROCESSES_AT_REST
from cascade_proto.v1 import reward_pb2 as pb
from cascade_proto.v1 import reward_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

MAIN_DB, KILL_DB = 11, 13


def _redis(db: int) -> Any:
    return redis_client(db)


@dataclass
class Service:
    main: Front
    """Broker db 11 with one worker; code and rlhf go to Celery, chunks of 2 items."""
    spare: Front
    """Broker db 13 with no worker of its own (the late-ack test starts them)."""
    no_broker: Front
    """Broker on a closed port."""
    log_dir: Path

    def stub(self, front: Front | None = None) -> pb_grpc.RewardServiceStub:
        return pb_grpc.RewardServiceStub((front or self.main).channel)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    flush_or_skip(MAIN_DB, KILL_DB)
    log_dir = tmp_path_factory.mktemp("reward-service")
    (log_dir / "user_rewards.py").write_text(USER_REWARDS)
    url = f"redis://{REDIS}"
    procs: list[Proc | Front] = []
    try:
        worker = start_worker("main-worker", f"{url}/{MAIN_DB}", log_dir, concurrency=2)
        procs.append(worker)
        fronts = [
            Front(
                "main",
                f"{url}/{MAIN_DB}",
                log_dir,
                *("--chunk-size", "2", "--task-timeout-s", "30"),
                *("--python-reward", "user_rewards:two_or_bust", "--python-reward-path", str(log_dir)),
            ),
            Front("spare", f"{url}/{KILL_DB}", log_dir, "--task-timeout-s", "50"),
            Front("no-broker", f"redis://127.0.0.1:{free_port()}/0", log_dir, "--chunk-size", "1"),
        ]
        procs += fronts
        worker.wait_for_log("ready.", 30)
        for front in fronts:
            front.wait_serving(30)
        yield Service(main=fronts[0], spare=fronts[1], no_broker=fronts[2], log_dir=log_dir)
    finally:
        for proc in procs:
            proc.stop()
        for db in (MAIN_DB, KILL_DB):
            _redis(db).flushdb()


def _items(problems: list[Problem], completions: list[str]) -> list[pb.Item]:
    return [
        pb.Item(
            problem=pb.Problem(id=p.id, prompt=p.prompt, answer=p.answer, meta_json=json.dumps(p.meta)),
            completion=c,
        )
        for p, c in zip(problems, completions, strict=True)
    ]


def _problems(domain: str, n: int) -> list[Problem]:
    return make_domain(DomainConfig(name=domain)).make_problems("eval", n, 0)  # type: ignore[arg-type]


WRONG = {
    "math": "The answer is \\boxed{-999}.",
    "code": "```python\ndef f(x):\n    return -999\n```",
    "if": "nothing at all",
    "swe": "I could not find the bug.",
}


def test_health_serving(service: Service) -> None:
    health = health_pb2_grpc.HealthStub(service.main.channel)
    for name in ("", "cascade.v1.RewardService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with urllib.request.urlopen(f"http://127.0.0.1:{service.main.metrics_port}/health", timeout=5) as r:
        assert r.status == 200 and r.read().strip() == b"SERVING"


@pytest.mark.parametrize("domain", ["math", "code", "if", "swe"])
def test_scores_correct_and_wrong_answers(service: Service, domain: str) -> None:
    problems = _problems(domain, 3)
    completions = [problems[0].answer, WRONG[domain], problems[2].answer]
    reply = service.stub().Score(
        pb.ScoreRequest(domain=domain, items=_items(problems, completions)), timeout=30
    )
    got = [(v.index, v.problem_id, v.reward, v.reason) for v in reply.verdicts]
    assert got[0] == (0, problems[0].id, 1.0, "ok")
    assert got[2] == (2, problems[2].id, 1.0, "ok")
    assert got[1][:2] == (1, problems[1].id)
    assert got[1][2] < 1.0 and got[1][3] not in ("ok", "infra_error"), reply.verdicts[1]


def test_reward_config_reaches_the_workers(service: Service) -> None:
    """`pass_fraction` (not the default all-pass) is applied by the Celery worker."""
    problem = _problems("code", 1)[0]
    n_shown, tests = problem.meta["n_shown"], problem.meta["tests"]
    known = {t["input"]: t["output"] for t in tests[: n_shown + 1]}  # the shown ones + 1 hidden
    program = f"def f(x):\n    return {known!r}.get(x, -999)"
    request = pb.ScoreRequest(
        domain="code", reward_config_json='{"mode": "pass_fraction"}', items=_items([problem], [program])
    )
    (verdict,) = service.stub().Score(request, timeout=30).verdicts
    assert verdict.reason == "wrong_answer"
    assert verdict.reward == pytest.approx(1 / (len(tests) - n_shown))  # only hidden tests pay


@pytest.mark.parametrize("domain", ["math", "code"])
def test_stream_yields_each_verdict_once(service: Service, domain: str) -> None:
    problems = _problems(domain, 5)
    completions = [p.answer if i % 2 == 0 else WRONG[domain] for i, p in enumerate(problems)]
    request = pb.ScoreRequest(domain=domain, items=_items(problems, completions))
    streamed = {
        v.index: (v.problem_id, v.reward, v.reason) for v in service.stub().ScoreStream(request, timeout=30)
    }
    batch = service.stub().Score(request, timeout=30).verdicts
    assert sorted(streamed) == [0, 1, 2, 3, 4]
    assert streamed == {v.index: (v.problem_id, v.reward, v.reason) for v in batch}
    assert [streamed[i][2] == "ok" for i in range(5)] == [True, False, True, False, True]


def _request(domain: str = "math", config: str = "", meta: str = "{}", **problem: Any) -> pb.ScoreRequest:
    fields = {"id": "p0", "prompt": "What is 1+1?", "answer": "2", "meta_json": meta, **problem}
    return pb.ScoreRequest(
        domain=domain,
        reward_config_json=config,
        items=[pb.Item(problem=pb.Problem(**fields), completion="\\boxed{2}")],
    )


USER_REWARDS = """
def two_or_bust(completion, answer, **kw):
    if "boom" in completion:
        raise RuntimeError("a bug in the user's function")
    return {"reward": 1.0 if "2" in completion else 0.5, "detail": "judged by user_rewards"}
"""

BAD_REQUESTS = {
    "domain without a verifier": (_request(domain="chemistry"), "domain 'chemistry' needs a verifier"),
    "not a domain name": (_request(domain="Chem istry"), "is not a domain name"),
    "a python reward the service does not list": (
        _request(domain="mine", config='{"kind": "python", "function": "os:system"}'),
        "reward.function 'os:system' is not a function this service runs",
    ),
    "invalid reward config": (_request("code", config='{"time_limit_s": -1}'), "time_limit_s"),
    "unknown reward field": (_request("code", config='{"time_limit": 3}'), "time_limit"),
    "reward kind of another domain": (_request("code", config='{"kind": "math"}'), "does not match"),
    "reward config not JSON": (_request(config="{mode: all_pass"), "reward_config_json: invalid JSON"),
    "empty batch": (pb.ScoreRequest(domain="math"), "empty batch"),
    "malformed meta": (_request(meta='{"tests": ['), "items[0].problem.meta_json: invalid JSON"),
    "meta not an object": (_request(meta="[1, 2]"), "items[0].problem.meta_json: expected a JSON object"),
    "item without problem": (
        pb.ScoreRequest(domain="math", items=[pb.Item(completion="x")]),
        "problem: missing",
    ),
    "problem without id": (_request(id=""), "items[0].problem.id: empty"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_are_invalid_argument(service: Service, case: str) -> None:
    request, message = BAD_REQUESTS[case]
    for call in (
        service.stub().Score,
        lambda r, timeout: list(service.stub().ScoreStream(r, timeout=timeout)),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
    assert service.stub().Score(_request(), timeout=10).verdicts[0].reason == "ok"  # still serving


def test_a_listed_python_reward_scores_a_free_domain_name(service: Service) -> None:
    """The service's own --python-reward-path is used, never the request's python_path; the
    function's failure is that item's infra_error, its neighbours keep their verdicts."""
    config = json.dumps(
        {"kind": "python", "function": "user_rewards:two_or_bust", "python_path": ["/nowhere"]}
    )
    problems = [Problem(f"gsm8k-{i}", "gsm8k", "1+1?", "2") for i in range(3)]
    request = pb.ScoreRequest(
        domain="gsm8k", reward_config_json=config, items=_items(problems, ["2", "boom", "three"])
    )
    got = service.stub().Score(request, timeout=60).verdicts
    assert [(v.reward, v.reason) for v in got] == [(1.0, "ok"), (0.0, "infra_error"), (0.5, "wrong_answer")]
    assert got[0].detail == "judged by user_rewards" and "RuntimeError" in got[1].detail


def _metrics(front: Front) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{front.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_count_requests_items_and_latency(service: Service) -> None:
    stub = service.stub()
    problems = _problems("if", 2)
    stub.Score(pb.ScoreRequest(domain="if", items=_items(problems, [problems[0].answer, "no"])), timeout=10)
    with pytest.raises(grpc.RpcError):
        stub.Score(pb.ScoreRequest(domain="if"), timeout=10)
    m = _metrics(service.main)
    assert m[("cascade_reward_items_total", (("domain", "if"), ("reason", "ok")))] >= 1
    assert m[("cascade_reward_items_total", (("domain", "if"), ("reason", "wrong_answer")))] >= 1
    ok = (("code", "OK"), ("domain", "if"), ("method", "Score"))
    bad = (("code", "INVALID_ARGUMENT"), ("domain", "if"), ("method", "Score"))
    assert m[("cascade_reward_requests_total", ok)] >= 1
    assert m[("cascade_reward_requests_total", bad)] >= 1
    assert m[("cascade_reward_request_seconds_count", (("domain", "if"), ("method", "Score")))] >= 2
    assert m[("cascade_reward_in_flight_requests", (("method", "Score"),))] == 0


def test_unreachable_broker_gives_infra_error_not_zero(service: Service) -> None:
    stub = service.stub(service.no_broker)
    problems = _problems("code", 2)
    start = time.monotonic()
    reply = stub.Score(
        pb.ScoreRequest(domain="code", items=_items(problems, [p.answer for p in problems])), timeout=30
    )
    assert time.monotonic() - start < 5  # one failed publish, not one per chunk
    assert [v.reason for v in reply.verdicts] == ["infra_error", "infra_error"]
    assert "reward queue unavailable" in reply.verdicts[0].detail
    math = _problems("math", 1)  # domains scored in the front are unaffected
    reply = stub.Score(pb.ScoreRequest(domain="math", items=_items(math, [math[0].answer])), timeout=30)
    assert reply.verdicts[0].reason == "ok"


def test_no_worker_answers_infra_error_before_the_deadline(service: Service) -> None:
    problems = _problems("code", 1)
    request = pb.ScoreRequest(domain="code", items=_items(problems, [problems[0].answer]))
    start = time.monotonic()
    try:
        (verdict,) = service.stub(service.spare).Score(request, timeout=4).verdicts
    finally:
        _redis(KILL_DB).flushdb()  # the task nobody took must not reach the next test's workers
    assert 2 < time.monotonic() - start < 4
    assert verdict.reason == "infra_error" and "no reward worker finished" in verdict.detail


def test_worker_killed_mid_task_is_redelivered_to_another(service: Service) -> None:
    """Late ack: SIGKILL the whole worker while it runs the task; Redis hands the unacked task
    to a second worker after the visibility timeout, and the client still gets a real verdict."""
    url = f"redis://{REDIS}/{KILL_DB}"
    problem = _problems("code", 1)[0]
    slow = "import time\ntime.sleep(3)\n" + problem.answer
    request = pb.ScoreRequest(
        domain="code", reward_config_json='{"time_limit_s": 15}', items=_items([problem], [slow])
    )
    first = start_worker("worker-a", url, service.log_dir, visibility_timeout_s=5)
    second: Proc | None = None
    try:
        first.wait_for_log("ready.", 30)
        future = service.stub(service.spare).Score.future(request, timeout=50)
        task_id = _wait_started(_redis(KILL_DB), timeout_s=20)
        first.kill()
        assert f"[{task_id}] received" in first.log() and "succeeded" not in first.log()
        second = start_worker("worker-b", url, service.log_dir, visibility_timeout_s=5)
        (verdict,) = future.result(timeout=50).verdicts
        assert (verdict.reward, verdict.reason) == (1.0, "ok"), verdict
        assert f"[{task_id}] succeeded" in second.log()
    finally:
        first.stop()
        if second is not None:
            second.stop()
        _redis(KILL_DB).flushdb()


def _wait_started(client: Any, timeout_s: float) -> str:
    """The id of the first task a worker has marked STARTED in the result backend."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for key in client.scan_iter("celery-task-meta-*"):
            meta = json.loads(client.get(key) or b"{}")
            if meta.get("status") == "STARTED":
                return str(meta["task_id"])
        time.sleep(0.05)
    raise TimeoutError(f"no task STARTED within {timeout_s}s")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")
def test_redis_outage_gives_infra_error_then_recovers(tmp_path: Path) -> None:
    """With its own Redis: down -> `infra_error` within seconds; back up -> real verdicts again,
    without restarting the front or the worker."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    redis_server = start_redis(port, tmp_path, "redis-1")
    procs: list[Proc | Front] = [redis_server]
    try:
        worker = start_worker("outage-worker", url, tmp_path)
        front = Front("outage-front", url, tmp_path, "--task-timeout-s", "20")
        procs += [worker, front]
        worker.wait_for_log("ready.", 30)
        front.wait_serving(30)
        stub = pb_grpc.RewardServiceStub(front.channel)
        problems = _problems("code", 1)
        request = pb.ScoreRequest(domain="code", items=_items(problems, [problems[0].answer]))
        assert stub.Score(request, timeout=20).verdicts[0].reason == "ok"

        redis_server.kill()
        start = time.monotonic()
        verdict = stub.Score(request, timeout=20).verdicts[0]
        assert verdict.reason == "infra_error" and time.monotonic() - start < 10, verdict

        procs.append(start_redis(port, tmp_path, "redis-2"))
        deadline = time.monotonic() + 30
        while (verdict := stub.Score(request, timeout=20).verdicts[0]).reason != "ok":
            assert verdict.reason == "infra_error", verdict
            assert time.monotonic() < deadline, f"no recovery: {verdict}"
            time.sleep(0.5)
    finally:
        for proc in reversed(procs):
            proc.stop()


CORPUS = sorted((Path(__file__).parent.parent / "security" / "corpus").glob("*.py"))
SANDBOX_UID = 61000


def _sandbox_groups_at_rest() -> dict[str, int]:
    """Processes per sandbox worker's pids cgroup; a worker at rest has exactly
    `PROCESSES_AT_REST` (bwrap, its init, the worker, its zygote): anything more is a program's
    process left behind."""
    root = Path("/sys/fs/cgroup/pids")
    return {g.name: len((g / "cgroup.procs").read_text().split()) for g in root.glob("cascade-sbx-*")}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_security_corpus_through_the_service(service: Service) -> None:
    """Every hostile program, sent as a completion through gRPC -> Celery -> the sandbox, ends with
    its expected reason; the service keeps serving and no program process is left."""
    reward = {
        "kind": "code",
        "time_limit_s": 1.0,
        "memory_mb": 256,
        "max_output_bytes": 4096,
        "max_processes": 8,
    }
    meta = {"tests": [{"input": 1, "output": 2}, {"input": 5, "output": 6}], "entry_point": "f"}
    items = [
        pb.Item(
            problem=pb.Problem(id=p.stem, prompt="Write f.", answer="", meta_json=json.dumps(meta)),
            completion=f"```python\n{p.read_text()}\n```",
        )
        for p in CORPUS
    ]
    request = pb.ScoreRequest(domain="code", reward_config_json=json.dumps(reward), items=items)
    reply = service.stub().Score(request, timeout=120)
    expected = {p.stem: p.read_text().splitlines()[0].removeprefix("# expect: ").strip() for p in CORPUS}
    got = {v.problem_id: v.reason for v in reply.verdicts}
    wrong = {v.problem_id: (v.reason, v.detail) for v in reply.verdicts if v.reason != expected[v.problem_id]}
    assert got == expected, wrong
    assert all(v.reward == (1.0 if v.reason == "ok" else 0.0) for v in reply.verdicts)
    test_health_serving(service)
    test_scores_correct_and_wrong_answers(service, "code")
    deadline = time.monotonic() + 5
    groups = _sandbox_groups_at_rest()
    while any(n > PROCESSES_AT_REST for n in groups.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        groups = _sandbox_groups_at_rest()
    assert groups and all(n <= PROCESSES_AT_REST for n in groups.values()), groups  # 0: a killed worker's


def test_unsandboxed_code_is_refused(service: Service) -> None:
    problems = _problems("code", 1)
    request = pb.ScoreRequest(
        domain="code",
        reward_config_json=json.dumps({"sandbox": "process"}),
        items=_items(problems, [problems[0].answer]),
    )
    with pytest.raises(grpc.RpcError) as err:
        service.stub().Score(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reward.sandbox: 'process' is not a sandbox" in (err.value.details() or "")


# --------------------------------------------------------------------------- poisoned items

CONTROL = "\x00\x07\x1b[2J\x1b]0;pwned\x07\r\x85\u202e"
"""What a hostile completion writes to spoof an operator's terminal or log (valid UTF-8)."""

POISONED_PROGRAMS = [
    # Raw bytes that are not UTF-8 (an encoded lone surrogate among them) and escapes.
    "import sys\n"
    "sys.stdout.buffer.write(b'\\xed\\xa0\\x80\\xff\\x00\\x1b[2J\\x1b]0;pwned\\x07\\r\\n')\n"
    "sys.stdout.flush()\n"
    "sys.stderr.buffer.write(b'\\xed\\xa0\\x80\\x1b[31m' * 1000)\n"
    "def f(x):\n    return -999\n",
    # An exception whose message is a lone surrogate, control characters and 100 KB.
    "def f(x):\n    raise ValueError('\\ud800\\udfff\\x00\\x1b[2J' * 25000)\n",
    # A return value that is a lone surrogate.
    "def f(x):\n    return '\\ud800\\x1b[2J'\n",
]


def _assert_clean(detail: str) -> None:
    detail.encode("utf-8")
    assert not any(ch in detail for ch in "\x00\x07\x1b\r\x85\u202e"), repr(detail)
    assert len(detail) <= 2000


def test_poisoned_math_completion_leaves_the_rest_of_the_batch_intact(service: Service) -> None:
    problems = _problems("math", 4)
    poisoned = f"{CONTROL}\\boxed{{-999{CONTROL}}}{CONTROL}" * 50
    completions = [problems[0].answer, poisoned, problems[2].answer, WRONG["math"]]
    request = pb.ScoreRequest(domain="math", items=_items(problems, completions))
    for verdicts in (
        list(service.stub().Score(request, timeout=30).verdicts),
        sorted(service.stub().ScoreStream(request, timeout=30), key=lambda v: v.index),
    ):
        assert [(v.index, v.problem_id) for v in verdicts] == [(i, p.id) for i, p in enumerate(problems)]
        assert [(v.reward, v.reason) for v in verdicts] == [
            (1.0, "ok"),
            (0.0, "wrong_answer"),
            (1.0, "ok"),
            (0.0, "wrong_answer"),
        ]
        for v in verdicts:
            _assert_clean(v.detail)


def test_poisoned_code_completions_leave_the_rest_of_the_batch_intact(service: Service) -> None:
    """A program that writes invalid UTF-8, lone surrogates and control characters into what a
    detail may quote gets its own verdict (never ok) and every other item its own, through the
    Celery worker, its JSON result and the gRPC reply (a lone surrogate used to fail the RPC)."""
    problems = _problems("code", 5)
    completions = [
        problems[0].answer,
        *(f"```python\n{program}```" for program in POISONED_PROGRAMS),
        problems[4].answer,
    ]
    reply = service.stub().Score(
        pb.ScoreRequest(domain="code", items=_items(problems, completions)), timeout=60
    )
    verdicts = list(reply.verdicts)
    assert [(v.index, v.problem_id) for v in verdicts] == [(i, p.id) for i, p in enumerate(problems)]
    assert (verdicts[0].reward, verdicts[0].reason) == (1.0, "ok")
    assert (verdicts[4].reward, verdicts[4].reason) == (1.0, "ok")
    for v in verdicts[1:4]:
        assert v.reward == 0.0 and v.reason != "ok", v
    for v in verdicts:
        _assert_clean(v.detail)

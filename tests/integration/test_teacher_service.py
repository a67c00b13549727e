"""The teacher service end to end: `python -m services.teacher.main` as a real subprocess on free
ports, hosting named teachers (copies and perturbations of the random tiny model) within a
memory budget that holds one and a half of them, and scoring within memory bounds that bind on
every request (forwards of at most 64 tokens, the logits of 2 positions at a time), so every
comparison with the learner's unbounded computation below is one of the bounded path."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from model_service_procs import Service

from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logits
from cascade.model.loading import load_model_weights_only
from cascade.transport.teacher_client import TeacherClient
from cascade_proto.v1 import teacher_pb2 as pb

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("torch_one_thread")]

PROMPTS = [[1, 5, 9, 13, 17], [4, 8], [30, 31, 32]]
COMPLETIONS = [[40, 41, 42, 43], [50, 51, 52, 53, 54, 2], [60, 61]]
BUDGET_MB = 5.0  # one tiny model is ~3.3 MB: a second teacher evicts the first
MAX_BATCH_TOKENS = 64
LOGITS_CHUNK_MIB = 2 * 384 * 4 / 2**20  # two positions of the tiny vocabulary


@pytest.fixture(scope="module")
def service(tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = Service(
        "services.teacher.main",
        "teacher",
        tmp_path_factory.mktemp("teacher"),
        "--teacher",
        f"math={tiny_checkpoints['base']}",
        "--teacher",
        f"code={tiny_checkpoints['perturbed1']}",
        "--memory-budget-mb",
        str(BUDGET_MB),
        "--max-wait-ms",
        "100",
        "--max-batch-tokens",
        str(MAX_BATCH_TOKENS),
        "--logits-chunk-mib",
        repr(LOGITS_CHUNK_MIB),
    )
    try:
        svc.wait_serving(60)
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def client(service: Service) -> TeacherClient:
    return TeacherClient(service.channel, timeout_s=60)


def reference(model_dir: Path, t: float) -> torch.Tensor:
    """The learner's computation: [B, C, V] log-probs of the teacher at temperature t."""
    model = load_model_weights_only(model_dir)
    sb = build_batch(PROMPTS, COMPLETIONS, pad_id=0)
    with torch.no_grad():
        return torch.log_softmax(completion_logits(model, sb, t), dim=-1)


def test_health(service: Service) -> None:
    health = health_pb2_grpc.HealthStub(service.channel)
    for name in ("", "cascade.v1.TeacherService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert service.http_health() == (200, b"SERVING")


@pytest.mark.parametrize(("teacher", "ckpt"), [("math", "base"), ("code", "perturbed1")])
def test_every_mode_matches_the_learner(
    client: TeacherClient, tiny_checkpoints: dict[str, Path], teacher: str, ckpt: str
) -> None:
    t = 0.8
    ref = reference(tiny_checkpoints[ckpt], t)
    sampled = client.logprobs(teacher, PROMPTS, COMPLETIONS, mode="sampled", temperature=t)
    topk = client.logprobs(teacher, PROMPTS, COMPLETIONS, mode="topk", temperature=t, topk=16)
    full = client.logprobs(teacher, PROMPTS, COMPLETIONS, mode="full", temperature=t)
    assert sampled.teacher == teacher and sampled.checkpoint == str(tiny_checkpoints[ckpt])
    for i, c in enumerate(COMPLETIONS):
        n = len(c)
        want = ref[i, :n].gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(sampled.scores[i].logprobs, want, atol=1e-5, rtol=0)
        values, ids = ref[i, :n].topk(16, dim=-1)
        assert torch.equal(topk.scores[i].topk_ids, ids)
        torch.testing.assert_close(topk.scores[i].topk_logprobs, values, atol=1e-5, rtol=0)
        torch.testing.assert_close(full.scores[i].full_logprobs, ref[i, :n], atol=1e-5, rtol=0)
    assert sampled.wire_bytes < topk.wire_bytes < full.wire_bytes


def test_wire_bytes_per_token_per_mode(service: Service, client: TeacherClient) -> None:
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 384, (16, 10), generator=gen).tolist()
    completions = torch.randint(3, 384, (16, 50), generator=gen).tolist()
    tokens = 16 * 50  # enough that the response's fixed fields (names, paths) do not count
    sizes = {
        mode: client.logprobs("math", prompts, completions, mode=mode, topk=16).wire_bytes / tokens
        for mode in ("sampled", "topk", "full")
    }
    assert 4 <= sizes["sampled"] < 4.5  # one float per token (+ framing)
    assert 16 * 4 + 16 <= sizes["topk"] < 16 * 4 + 16 * 2 + 1  # k floats + k ids (1-2 byte varints)
    assert 384 * 4 <= sizes["full"] < 384 * 4 + 1  # the whole vocabulary
    text = service.metrics()
    for mode in ("sampled", "topk", "full"):
        m = re.search(rf'cascade_teacher_wire_bytes_per_token\{{mode="{mode}"\}} ([0-9.e+]+)', text)
        assert m and float(m.group(1)) > 0, mode


def test_teachers_load_on_demand_within_the_budget(
    client: TeacherClient, tiny_checkpoints: dict[str, Path]
) -> None:
    client.logprobs("math", PROMPTS, COMPLETIONS)
    listed = client.list_teachers()
    assert listed.memory_budget_bytes == int(BUDGET_MB * 2**20)
    assert {t.name: t.loaded for t in listed.teachers} == {"code": False, "math": True}
    client.logprobs("code", PROMPTS, COMPLETIONS)
    listed = client.list_teachers()
    assert {t.name: t.loaded for t in listed.teachers} == {"code": True, "math": False}
    assert sum(t.bytes for t in listed.teachers if t.loaded) <= listed.memory_budget_bytes

    info = client.set_teacher("if", str(tiny_checkpoints["perturbed2"]))
    assert (info.name, info.loaded) == ("if", False)
    reply = client.logprobs("if", PROMPTS, COMPLETIONS)
    ref = reference(tiny_checkpoints["perturbed2"], 1.0)
    want = ref[0, :4].gather(-1, torch.tensor(COMPLETIONS[0]).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(reply.scores[0].logprobs, want, atol=1e-5, rtol=0)
    # a domain's new best checkpoint replaces the teacher's weights
    client.set_teacher("if", str(tiny_checkpoints["base"]))
    again = client.logprobs("if", PROMPTS, COMPLETIONS)
    assert again.checkpoint == str(tiny_checkpoints["base"])
    assert not torch.equal(again.scores[0].logprobs, reply.scores[0].logprobs)


def test_concurrent_requests_share_a_batch(service: Service, client: TeacherClient) -> None:
    client.logprobs("math", PROMPTS, COMPLETIONS)  # resident, so the requests below queue together
    results: list[int] = []
    gate = threading.Barrier(4)

    def call() -> None:
        gate.wait()
        results.append(len(client.logprobs("math", PROMPTS, COMPLETIONS).scores))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [3, 3, 3, 3]
    m = re.search(r'cascade_teacher_batch_requests_bucket\{le="1.0"\} ([0-9.]+)', service.metrics())
    count = re.search(r"cascade_teacher_batch_requests_count ([0-9.]+)", service.metrics())
    assert m and count and float(m.group(1)) < float(count.group(1)), "some batch merged several requests"


def _request(**overrides) -> pb.LogprobsRequest:
    fields = {
        "teacher": "math",
        "mode": pb.LOGPROB_MODE_SAMPLED,
        "sequences": [pb.ScoredSequence(prompt_ids=[1, 2], completion_ids=[3, 4])],
        **overrides,
    }
    return pb.LogprobsRequest(**fields)


BAD_REQUESTS = {
    "unknown teacher": (_request(teacher="chemistry"), "unknown teacher 'chemistry' (known: code, "),
    "no teacher": (_request(teacher=""), "teacher: empty"),
    "no mode": (_request(mode=pb.LOGPROB_MODE_UNSPECIFIED), "mode: set LOGPROB_MODE_SAMPLED"),
    "no sequences": (_request(sequences=[]), "sequences: empty"),
    "empty prompt": (
        _request(sequences=[pb.ScoredSequence(prompt_ids=[], completion_ids=[3])]),
        "sequences[0].prompt_ids: empty prompt",
    ),
    "empty completion": (
        _request(sequences=[pb.ScoredSequence(prompt_ids=[1], completion_ids=[])]),
        "sequences[0].completion_ids: empty",
    ),
    "out of vocabulary": (
        _request(sequences=[pb.ScoredSequence(prompt_ids=[1], completion_ids=[3, 500])]),
        "completion_ids: token id 500 out of the vocabulary [0, 384)",
    ),
    "over the context": (
        _request(sequences=[pb.ScoredSequence(prompt_ids=[1] * 200, completion_ids=[3] * 60)]),
        "200 + 60 tokens exceed the teacher's context of 256",
    ),
    "over a forward": (
        _request(sequences=[pb.ScoredSequence(prompt_ids=[1] * 50, completion_ids=[3] * 20)]),
        "sequences[0]: 50 + 20 tokens exceed the teacher service's --max-batch-tokens of 64",
    ),
    "topk 0": (_request(mode=pb.LOGPROB_MODE_TOPK, topk=0), "topk: must be in [1, 384]"),
    "temperature 0": (_request(temperature=0.0), "temperature: must be > 0"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_are_invalid_argument(client: TeacherClient, case: str) -> None:
    request, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as err:
        client.stub.Logprobs(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_bad_teacher_checkpoints(client: TeacherClient, tiny_checkpoints: dict[str, Path]) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.set_teacher("swe", str(tiny_checkpoints["base"] / "missing"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a model directory" in err.value.details()
    client.set_teacher("broken", str(tiny_checkpoints["truncated"]))
    with pytest.raises(grpc.RpcError) as err:
        client.logprobs("broken", PROMPTS, COMPLETIONS)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unreadable checkpoint" in err.value.details()
    assert len(client.logprobs("math", PROMPTS, COMPLETIONS).scores) == 3  # still serving

"""The rollout service end to end: `python -m services.rollout.main` as a real subprocess on free
ports (HF engine, CPU, random tiny model), every RPC called through gRPC, stopped by pid.

Each test that depends on which weights are served loads them first (an update takes ~20 ms).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from model_service_procs import Service
from safetensors.torch import load_file

from cascade.config import ChatConfig
from cascade.engine.base import SamplingSettings
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logprobs
from cascade.model.chat import encode_messages
from cascade.model.loading import load_policy
from cascade.transport.rollout_client import RolloutClient, generate_request, weight_chunks
from cascade_proto.v1 import rollout_pb2 as pb

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("torch_one_thread")]

PROMPTS = [[1, 5, 9, 13, 17, 21, 25], [4, 8], [30, 31, 32, 33]]
SAMPLING = SamplingSettings(max_tokens=12, temperature=0.8, top_p=0.9, seed=11)


@pytest.fixture(scope="module")
def service(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = Service(
        "services.rollout.main",
        "rollout",
        tmp_path_factory.mktemp("rollout"),
        "--model",
        str(random_tiny_model),
    )
    try:
        svc.wait_serving(60)
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def client(service: Service) -> RolloutClient:
    return RolloutClient(service.channel, timeout_s=60)


def learner_logprobs(model_dir: Path, prompts: list[list[int]], completions: list[list[int]], t: float):
    policy = load_policy(model_dir)
    sb = build_batch(prompts, completions, policy.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(policy.model, sb, t)
    return [lp[i, : len(c)] for i, c in enumerate(completions)]


def assert_learner_equal(model_dir: Path, reply, t: float) -> None:
    """Every completion's log-probs equal the learner's on the same tokens within 1e-4."""
    gen = reply.result.generation
    repeated = [p for p in reply.prompt_ids for _ in range(reply.result.n)]
    ref = learner_logprobs(model_dir, repeated, gen.completion_ids, t)
    for got, want in zip(gen.logprobs, ref, strict=True):
        torch.testing.assert_close(torch.tensor(got), want, atol=1e-4, rtol=0)


def test_health_and_model_info(service: Service, client: RolloutClient, random_tiny_model: Path) -> None:
    health = health_pb2_grpc.HealthStub(service.channel)
    for name in ("", "cascade.v1.RolloutService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert service.http_health() == (200, b"SERVING")
    info, _ = client.model_info()
    assert (info.kind, info.model, info.vocab_size, info.max_context, info.eos_token_ids) == (
        "hf",
        str(random_tiny_model),
        384,
        256,
        [2],
    )


def test_logprobs_match_the_learner(client: RolloutClient, tiny_checkpoints: dict[str, Path]) -> None:
    client.update_weights(str(tiny_checkpoints["base"]))
    reply = client.generate(PROMPTS, group_size=3, sampling=SAMPLING)
    assert reply.prompt_ids == PROMPTS and len(reply.result.generation.completion_ids) == 9
    assert_learner_equal(tiny_checkpoints["base"], reply, SAMPLING.temperature)
    again = client.generate(PROMPTS, group_size=3, sampling=SAMPLING)
    assert again.result.generation.completion_ids == reply.result.generation.completion_ids  # seeded
    greedy = client.generate(PROMPTS[:1], group_size=2, sampling=SamplingSettings(max_tokens=6, greedy=True))
    a, b = greedy.result.generation.completion_ids
    assert a == b
    assert_learner_equal(tiny_checkpoints["base"], greedy, 1.0)


def test_chat_prompts_use_the_template_and_thinking_flag(
    client: RolloutClient, random_tiny_model: Path
) -> None:
    tokenizer = load_policy(random_tiny_model).tokenizer
    chat = [{"role": "user", "content": "What is 2+3?"}]
    for thinking in (False, True):
        reply = client.generate([chat], group_size=1, sampling=SAMPLING, thinking=thinking)
        assert reply.prompt_ids == [encode_messages(tokenizer, ChatConfig(), chat, thinking)]
    on = client.generate([chat], group_size=1, sampling=SAMPLING, thinking=True).prompt_ids
    off = client.generate([chat], group_size=1, sampling=SAMPLING, thinking=False).prompt_ids
    assert on != off


def test_weight_update_between_generate_calls_changes_output(
    service: Service, client: RolloutClient, tiny_checkpoints: dict[str, Path]
) -> None:
    client.update_weights(str(tiny_checkpoints["base"]))
    before = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    update = client.update_weights(str(tiny_checkpoints["perturbed1"]))
    assert update.version == before.result.version + 1 and update.bytes > 0
    after = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    assert after.result.version == update.version
    assert after.result.generation.logprobs != before.result.generation.logprobs
    assert after.result.generation.completion_ids != before.result.generation.completion_ids
    assert_learner_equal(tiny_checkpoints["perturbed1"], after, SAMPLING.temperature)

    # streamed tensors (no shared storage), several chunks per tensor, an explicit version
    tensors = load_file(str(tiny_checkpoints["perturbed2"] / "model.safetensors"))
    streamed = client.stream_weights(tensors, version=update.version + 10, chunk_bytes=64 * 1024)
    assert streamed.version == update.version + 10
    third = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    assert third.result.version == streamed.version
    assert_learner_equal(tiny_checkpoints["perturbed2"], third, SAMPLING.temperature)

    back = client.update_weights(str(tiny_checkpoints["base"]))
    restored = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    assert restored.result.version == back.version
    assert restored.result.generation.completion_ids == before.result.generation.completion_ids
    assert re.search(r'cascade_rollout_weight_update_bytes_total\{source="stream"\} [1-9]', service.metrics())


REFUSED = {
    "truncated": "unreadable safetensors file",
    "wrong_shape": "mismatched checkpoint: .*has shape",
    "wrong_config": "mismatched checkpoint: config num_hidden_layers is 5",
    "nan": "corrupted checkpoint",
    "missing": "incomplete checkpoint",
}


def test_refused_checkpoints_keep_the_old_weights_serving(
    service: Service, client: RolloutClient, tiny_checkpoints: dict[str, Path]
) -> None:
    served = client.update_weights(str(tiny_checkpoints["perturbed1"]))
    before = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    for name, message in REFUSED.items():
        with pytest.raises(grpc.RpcError) as err:
            client.update_weights(str(tiny_checkpoints[name]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert re.search(message, err.value.details()), err.value.details()
        assert str(tiny_checkpoints[name]) in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        client.update_weights(str(tiny_checkpoints["base"]), version=served.version)
    assert "not above the current version" in err.value.details()
    bad_stream = list(weight_chunks({"model.norm.weight": torch.ones(7)}, None, chunk_bytes=1024))
    with pytest.raises(grpc.RpcError) as err:
        client.stub.UpdateWeightsStream(iter(bad_stream), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "streamed weights: incomplete checkpoint: 45 missing" in err.value.details()  # all or nothing
    after = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    assert after.result.version == served.version
    assert after.result.generation.logprobs == before.result.generation.logprobs
    assert re.search(
        r'cascade_rollout_weight_updates_refused_total\{source="checkpoint"\} [5-9]', service.metrics()
    )


def _in_flight(service: Service) -> float:
    m = re.search(r'cascade_rollout_in_flight_requests\{method="Generate"\} ([0-9.]+)', service.metrics())
    return float(m.group(1)) if m else 0.0


def test_in_flight_request_finishes_on_its_weights(
    service: Service, client: RolloutClient, tiny_checkpoints: dict[str, Path]
) -> None:
    old = client.update_weights(str(tiny_checkpoints["base"]))
    long = generate_request(
        [[1, 2, 3]], group_size=8, sampling=SamplingSettings(max_tokens=220, seed=5), thinking=False
    )
    future = client.stub.Generate.future(long, timeout=60)
    deadline = time.monotonic() + 30
    while _in_flight(service) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # past parsing: the engine has taken its weights
    new = client.update_weights(str(tiny_checkpoints["perturbed1"]))
    assert not future.done(), "the update must land while the long request is still running"
    reply = future.result()
    assert new.version == old.version + 1
    assert reply.policy_version == old.version
    from cascade.transport.rollout_client import from_response

    assert_learner_equal(tiny_checkpoints["base"], from_response(reply, 8), 1.0)
    assert client.generate([[1, 2, 3]], group_size=1, sampling=SAMPLING).result.version == new.version


def _request(**overrides) -> pb.GenerateRequest:
    fields = {
        "prompts": [pb.Prompt(token_ids=pb.TokenIds(ids=[1, 2, 3]))],
        "group_size": 2,
        "max_tokens": 4,
        **overrides,
    }
    return pb.GenerateRequest(**fields)


BAD_REQUESTS = {
    "no prompts": (_request(prompts=[]), "prompts: empty"),
    "empty token prompt": (_request(prompts=[pb.Prompt(token_ids=pb.TokenIds(ids=[]))]), "empty prompt"),
    "unset prompt": (_request(prompts=[pb.Prompt()]), "prompts[0]: empty prompt (set token_ids or chat)"),
    "empty chat": (
        _request(prompts=[pb.Prompt(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=" ")]))]),
        "no user message with content",
    ),
    "bad role": (
        _request(prompts=[pb.Prompt(chat=pb.Chat(messages=[pb.ChatMessage(role="robot", content="hi")]))]),
        "role: 'robot' not one of",
    ),
    "group size 0": (_request(group_size=0), "group_size: must be at least 1 (got 0)"),
    "out of vocabulary": (
        _request(prompts=[pb.Prompt(token_ids=pb.TokenIds(ids=[1, 384]))]),
        "token id 384 out of the vocabulary [0, 384)",
    ),
    "over the context": (
        _request(max_tokens=254),
        "3 prompt tokens + max_tokens 254 exceed the model's context of 256",
    ),
    "max tokens 0": (_request(max_tokens=0), "max_tokens: must be at least 1"),
    "temperature 0": (_request(sampling=pb.SamplingSettings(temperature=0.0)), "temperature: must be > 0"),
    "top_p over 1": (_request(sampling=pb.SamplingSettings(top_p=1.5)), "top_p: must be in (0, 1]"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_are_invalid_argument(client: RolloutClient, case: str) -> None:
    request, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as err:
        client.stub.Generate(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_bad_weight_requests_and_metrics(service: Service, client: RolloutClient) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.stub.UpdateWeights(pb.UpdateWeightsRequest(), timeout=30)
    assert (
        err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "checkpoint_path: empty" in err.value.details()
    )
    with pytest.raises(grpc.RpcError) as err:
        client.stub.UpdateWeightsStream(iter([]), timeout=30)
    assert "empty stream" in err.value.details()
    # concurrent generate calls are all served (the engine is shared, each call is independent)
    results: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(client.generate(PROMPTS, group_size=2, sampling=SAMPLING).result.n)
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [2, 2, 2]
    text = service.metrics()
    assert re.search(
        r'cascade_rollout_requests_total\{code="INVALID_ARGUMENT",method="Generate"\} [1-9]', text
    )
    assert re.search(r"cascade_rollout_generated_tokens_total [1-9]", text)
    assert "cascade_rollout_policy_version" in text

"""The rollout service on real vLLM (CPU build): `cascade-rollout --engine vllm` from the vLLM
environment as a subprocess on free ports, every RPC through gRPC, stopped by pid.

Generate (token and chat prompts), UpdateWeights (a checkpoint path), UpdateWeightsStream
(tensors in chunks), refused checkpoints, GetModelInfo, gRPC and HTTP health, metrics. The
log-probs it returns are checked against the learner's recomputation (top_p 1).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from model_service_procs import Service
from reward_procs import Proc
from safetensors.torch import load_file
from vllm_procs import ENGINE_ENV, START_TIMEOUT_S, VLLM_PYTHON, require_vllm_env

from cascade.config import ChatConfig
from cascade.engine.base import SamplingSettings
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logprobs
from cascade.model.chat import encode_messages
from cascade.model.loading import load_policy
from cascade.transport.rollout_client import RolloutClient, from_response, generate_request

pytestmark = [pytest.mark.timeout(1200), pytest.mark.usefixtures("torch_one_thread")]

PROMPTS = [[1, 5, 9, 13, 17, 21, 25], [4, 8], [30, 31, 32, 33]]
SAMPLING = SamplingSettings(max_tokens=12, temperature=0.8, top_p=1.0, seed=11)


class VllmService(Service):
    """`Service` with the vLLM environment's Python and the engine's CPU settings."""

    def __init__(self, log_dir: Path, *flags: str) -> None:
        from reward_procs import free_port

        self.port, self.metrics_port = free_port(), free_port()
        argv = [str(VLLM_PYTHON), "-m", "services.rollout.main", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--metrics-port", str(self.metrics_port), *flags]
        env = {**os.environ, **ENGINE_ENV, "PYTHONUNBUFFERED": "1"}
        env.pop("VIRTUAL_ENV", None)
        self.proc = Proc("rollout-vllm", argv, env, log_dir)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")


@pytest.fixture(scope="module")
def service(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmService]:
    require_vllm_env()
    svc = VllmService(
        tmp_path_factory.mktemp("rollout-vllm"),
        "--engine",
        "vllm",
        "--model",
        str(random_tiny_model),
        "--kv-cache-gib",
        "0.25",
    )
    try:
        svc.wait_serving(START_TIMEOUT_S)
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def client(service: VllmService) -> RolloutClient:
    return RolloutClient(service.channel, timeout_s=300)


def assert_learner_equal(model_dir: Path, reply, t: float) -> None:  # type: ignore[no-untyped-def]
    gen = reply.result.generation
    repeated = [p for p in reply.prompt_ids for _ in range(reply.result.n)]
    policy = load_policy(model_dir)
    batch = build_batch(repeated, gen.completion_ids, policy.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(policy.model, batch, t)
    for i, (got, ids) in enumerate(zip(gen.logprobs, gen.completion_ids, strict=True)):
        torch.testing.assert_close(torch.tensor(got), lp[i, : len(ids)], atol=1e-4, rtol=0)


def test_health_info_and_generate(
    service: VllmService, client: RolloutClient, random_tiny_model: Path
) -> None:
    health = health_pb2_grpc.HealthStub(service.channel)
    for name in ("", "cascade.v1.RolloutService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert service.http_health() == (200, b"SERVING")
    info, version = client.model_info()
    assert (info.kind, info.model, info.vocab_size, info.max_context, info.eos_token_ids, version) == (
        "vllm",
        str(random_tiny_model),
        384,
        256,
        [2],
        0,
    )
    reply = client.generate(PROMPTS, group_size=3, sampling=SAMPLING)
    assert reply.prompt_ids == PROMPTS and len(reply.result.generation.completion_ids) == 9
    assert reply.result.version == 0
    assert_learner_equal(random_tiny_model, reply, SAMPLING.temperature)
    again = client.generate(PROMPTS, group_size=3, sampling=SAMPLING)
    assert again.result.generation.completion_ids == reply.result.generation.completion_ids  # seeded

    tokenizer = load_policy(random_tiny_model).tokenizer
    chat = [{"role": "user", "content": "What is 2+3?"}]
    chat_reply = client.generate([chat], group_size=2, sampling=SAMPLING, thinking=True)
    assert chat_reply.prompt_ids == [encode_messages(tokenizer, ChatConfig(), chat, True)]


def test_updates_by_path_and_stream_then_refusals(
    service: VllmService, client: RolloutClient, tiny_checkpoints: dict[str, Path]
) -> None:
    before = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    update = client.update_weights(str(tiny_checkpoints["perturbed1"]))
    assert update.version == before.result.version + 1 and update.bytes > 0
    after = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    assert after.result.version == update.version
    assert after.result.generation.completion_ids != before.result.generation.completion_ids
    assert_learner_equal(tiny_checkpoints["perturbed1"], after, SAMPLING.temperature)

    tensors = load_file(str(tiny_checkpoints["perturbed2"] / "model.safetensors"))
    streamed = client.stream_weights(tensors, version=update.version + 10, chunk_bytes=64 * 1024)
    assert streamed.version == update.version + 10
    third = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    assert third.result.version == streamed.version
    assert_learner_equal(tiny_checkpoints["perturbed2"], third, SAMPLING.temperature)

    for name, message in (("wrong_shape", "has shape"), ("nan", "corrupted checkpoint")):
        with pytest.raises(grpc.RpcError) as err:
            client.update_weights(str(tiny_checkpoints[name]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
    still = client.generate(PROMPTS, group_size=2, sampling=SAMPLING)
    assert still.result.version == streamed.version
    assert still.result.generation.completion_ids == third.result.generation.completion_ids

    metrics = service.metrics()
    assert re.search(r'cascade_rollout_weight_update_bytes_total\{source="stream"\} [1-9]', metrics)
    assert re.search(r'cascade_rollout_weight_updates_refused_total\{source="checkpoint"\} 2', metrics)


def test_a_request_in_flight_during_an_update_names_the_weights_it_ran_on(
    service: VllmService, client: RolloutClient, tiny_checkpoints: dict[str, Path]
) -> None:
    """vLLM updates in place, so an update waits for the call in flight (the drain strategy):
    whichever way the race goes, the reply's version is that of the weights its log-probs come from."""
    old = client.update_weights(str(tiny_checkpoints["base"]))
    long = generate_request(
        [[1, 2, 3]], group_size=8, sampling=SamplingSettings(max_tokens=200, seed=5), thinking=False
    )
    future = client.stub.Generate.future(long, timeout=300)
    deadline = time.monotonic() + 60
    while not _in_flight(service) and time.monotonic() < deadline:
        time.sleep(0.01)
    new = client.update_weights(str(tiny_checkpoints["perturbed1"]))
    reply = from_response(future.result(), 8)
    assert new.version == old.version + 1 and reply.result.version in (old.version, new.version)
    drained = reply.result.version == old.version
    print(f"request in flight finished on the {'old' if drained else 'new'} weights")
    ran_on = tiny_checkpoints["base" if drained else "perturbed1"]
    assert_learner_equal(ran_on, reply, 1.0)
    after = client.generate([[1, 2, 3]], group_size=1, sampling=SAMPLING)
    assert after.result.version == new.version


def _in_flight(service: VllmService) -> bool:
    m = re.search(r'cascade_rollout_in_flight_requests\{method="Generate"\} ([0-9.]+)', service.metrics())
    return bool(m and float(m.group(1)) >= 1)

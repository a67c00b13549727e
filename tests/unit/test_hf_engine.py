"""The HF engine behind the `Engine` interface: learner-equal log-probs, versioned weight
switches (swap and drain), refused checkpoints that leave the old weights serving, request
checks, and the streamed-weights wire format."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cascade.engine.base import Engine, EngineRequestError, SamplingSettings, WeightUpdateError
from cascade.engine.batch import build_batch
from cascade.engine.hf_engine import HFEngine
from cascade.engine.logprobs import completion_logprobs
from cascade.engine.weights import read_checkpoint, tensor_from_bytes
from cascade.model.loading import load_model_weights_only
from cascade.transport.rollout_client import weight_chunks
from services.rollout.requests import assemble_stream

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[1, 5, 9, 13, 17], [4, 8], [30, 31, 32]]
SAMPLING = SamplingSettings(max_tokens=10, temperature=0.8, top_p=0.95, seed=7)


@pytest.fixture
def engine(random_tiny_model: Path) -> HFEngine:
    return HFEngine.from_dir(random_tiny_model)


def learner_logprobs(model_dir: Path, prompts: list[list[int]], completions: list[list[int]], t: float):
    model = load_model_weights_only(model_dir)
    sb = build_batch(prompts, completions, pad_id=0)
    with torch.no_grad():
        lp = completion_logprobs(model, sb, t)
    return [lp[i, : len(c)] for i, c in enumerate(completions)]


def assert_matches(model_dir: Path, prompts, gen, t: float, n: int) -> None:
    repeated = [p for p in prompts for _ in range(n)]
    ref = learner_logprobs(model_dir, repeated, gen.completion_ids, t)
    for got, want in zip(gen.logprobs, ref, strict=True):
        torch.testing.assert_close(torch.tensor(got), want, atol=1e-4, rtol=0)


def test_is_an_engine_and_logprobs_match_the_learner(engine: HFEngine, random_tiny_model: Path) -> None:
    assert isinstance(engine, Engine)
    out = engine.generate(PROMPTS, 3, SAMPLING)
    assert out.version == 0 and out.n == 3
    assert len(out.generation.completion_ids) == 9
    assert_matches(random_tiny_model, PROMPTS, out.generation, SAMPLING.temperature, 3)
    again = engine.generate(PROMPTS, 3, SAMPLING)
    assert again.generation.completion_ids == out.generation.completion_ids  # same seed


def test_update_changes_output_and_version(engine: HFEngine, tiny_checkpoints: dict[str, Path]) -> None:
    before = engine.generate(PROMPTS, 2, SAMPLING)
    update = engine.load_checkpoint(tiny_checkpoints["perturbed1"])
    assert update.version == 1 and engine.version == 1 and update.bytes > 0
    after = engine.generate(PROMPTS, 2, SAMPLING)
    assert after.version == 1
    assert after.generation.logprobs != before.generation.logprobs
    assert_matches(tiny_checkpoints["perturbed1"], PROMPTS, after.generation, SAMPLING.temperature, 2)
    assert engine.load_checkpoint(tiny_checkpoints["base"], version=7).version == 7
    with pytest.raises(WeightUpdateError, match="not above the current version 7"):
        engine.load_checkpoint(tiny_checkpoints["perturbed2"], version=7)
    restored = engine.generate(PROMPTS, 2, SAMPLING)
    assert restored.generation.completion_ids == before.generation.completion_ids


REFUSED = {
    "truncated": "unreadable safetensors file",
    "garbage": "unreadable safetensors file",
    "wrong_shape": "mismatched checkpoint: .*mlp.up_proj.weight has shape",
    "wrong_config": "mismatched checkpoint: config num_hidden_layers is 5",
    "nan": "corrupted checkpoint: .* NaN or inf",
    "missing": "incomplete checkpoint: 1 missing",
    "empty": "no model.safetensors or model.safetensors.index.json",
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_checkpoint_keeps_old_weights(
    engine: HFEngine, tiny_checkpoints: dict[str, Path], name: str
) -> None:
    before = engine.generate(PROMPTS, 1, SAMPLING)
    with pytest.raises(WeightUpdateError, match=REFUSED[name]):
        engine.load_checkpoint(tiny_checkpoints[name])
    assert engine.version == 0
    after = engine.generate(PROMPTS, 1, SAMPLING)
    assert after.generation.completion_ids == before.generation.completion_ids
    assert after.generation.logprobs == before.generation.logprobs


def test_unknown_tensor_refused(engine: HFEngine, random_tiny_model: Path) -> None:
    tensors = read_checkpoint(random_tiny_model)
    tensors["model.extra.weight"] = torch.zeros(2)
    with pytest.raises(WeightUpdateError, match="does not have, e.g. \\['model.extra.weight'\\]"):
        engine.load_tensors(tensors)
    assert engine.version == 0


@pytest.mark.parametrize("swap", [True, False])
def test_in_flight_call_finishes_on_its_weights(
    random_tiny_model: Path, tiny_checkpoints: dict[str, Path], swap: bool
) -> None:
    """A long call running when an update lands reports (and used) the version it started on."""
    engine = HFEngine.from_dir(random_tiny_model, swap=swap)
    long = SamplingSettings(max_tokens=200, seed=3)
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(out=engine.generate([[1, 2, 3]], 8, long)))
    worker.start()
    deadline = time.monotonic() + 10
    while engine._active == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    update = engine.load_checkpoint(tiny_checkpoints["perturbed1"])
    landed_while_running = worker.is_alive()
    worker.join()
    out = result["out"]
    assert update.version == 1
    assert out.version == 0  # type: ignore[attr-defined]
    assert_matches(random_tiny_model, [[1, 2, 3]], out.generation, 1.0, 8)  # type: ignore[attr-defined]
    if swap:
        assert landed_while_running, "swap mode must not wait for calls in flight"
    assert engine.generate([[1, 2, 3]], 1, SAMPLING).version == 1


@pytest.mark.parametrize(
    ("prompts", "n", "sampling", "message"),
    [
        ([], 1, SAMPLING, "prompts: empty"),
        ([[1], []], 1, SAMPLING, "prompts\\[1\\]: empty prompt"),
        ([[1]], 0, SAMPLING, "group_size: must be at least 1"),
        ([[1, 384]], 1, SAMPLING, "token id 384 out of the vocabulary \\[0, 384\\)"),
        ([[1, -1]], 1, SAMPLING, "token id -1 out of the vocabulary"),
        (
            [[1] * 10],
            1,
            SamplingSettings(max_tokens=250),
            "10 prompt tokens \\+ max_tokens 250 exceed .* 256",
        ),
        ([[1]], 1, SamplingSettings(max_tokens=0), "max_tokens: must be at least 1"),
        ([[1]], 1, SamplingSettings(max_tokens=4, temperature=0), "temperature: must be > 0"),
        ([[1]], 1, SamplingSettings(max_tokens=4, top_p=1.5), "top_p: must be in"),
    ],
)
def test_bad_requests(engine: HFEngine, prompts, n, sampling, message) -> None:
    with pytest.raises(EngineRequestError, match=message):
        engine.generate(prompts, n, sampling)


def test_streamed_weights_round_trip(engine: HFEngine, tiny_checkpoints: dict[str, Path]) -> None:
    tensors = load_file(str(tiny_checkpoints["perturbed1"] / "model.safetensors"))
    tensors = {n: (t.to(torch.bfloat16) if i % 2 else t) for i, (n, t) in enumerate(tensors.items())}
    chunks = list(weight_chunks(tensors, 5, chunk_bytes=1000))
    assert len(chunks) > len(tensors)  # large tensors span several chunks
    assert chunks[0].version == 5 and not chunks[1].HasField("version")
    back, version = assemble_stream(chunks)
    assert version == 5 and list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype
        torch.testing.assert_close(back[name], t, rtol=0, atol=0)
    assert engine.load_tensors(back, version).version == 5


def test_stream_errors() -> None:
    with pytest.raises(WeightUpdateError, match="empty stream"):
        assemble_stream([])
    with pytest.raises(WeightUpdateError, match="7 bytes for shape \\[2\\] float32"):
        tensor_from_bytes("w", "float32", [2], b"1234567")
    with pytest.raises(WeightUpdateError, match="dtype 'int8'"):
        tensor_from_bytes("w", "int8", [2], b"12")
    chunks = list(weight_chunks({"a": torch.ones(2), "b": torch.ones(1)}, None, chunk_bytes=4))
    with pytest.raises(WeightUpdateError, match="a sent twice"):
        assemble_stream([*chunks, *chunks[:1]])

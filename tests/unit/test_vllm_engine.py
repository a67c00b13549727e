"""The vLLM engine. vLLM cannot be installed on these machines, so:

- the engine's own logic (sampling-parameter mapping, output conversion, checks before a weight
  reload, the reload calls, versions) runs here against a stand-in `vllm` module that records
  what the engine asks of it;
- the test against real vLLM skips with the reason when vLLM is absent (always, here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cascade.engine.base import Engine, EngineRequestError, SamplingSettings, WeightUpdateError
from cascade.engine.vllm import (
    WORKER_EXTENSION,
    EngineUnavailableError,
    VLLMEngine,
    import_vllm,
    vllm_available,
)
from cascade.engine.vllm_worker import CascadeWeightLoader
from cascade.engine.weights import read_checkpoint


class FakeTokenizer:
    eos_token_id = 2
    pad_token_id = 0

    def __len__(self) -> int:
        return 384


@dataclass
class FakeLLM:
    kwargs: dict[str, Any]
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def get_tokenizer(self) -> Any:
        return FakeTokenizer()

    def generate(self, prompts: list[Any], params: Any, use_tqdm: bool = True) -> list[Any]:
        self.calls.append(("generate", (prompts, params)))
        outs = []
        for p in prompts:
            completions = []
            for j in range(params.n):
                ids = [p.prompt_token_ids[0] + j, 2] if j % 2 == 0 else [7, 8, 9]
                logprobs = [
                    {t: SimpleNamespace(logprob=-0.5 * (k + 1)), 999: None} for k, t in enumerate(ids)
                ]
                reason = "stop" if j % 2 == 0 else "length"
                completions.append(SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=reason))
            outs.append(SimpleNamespace(outputs=completions))
        return outs

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls.append(("collective_rpc", (method, args)))
        return [None]

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache", None))


def fake_vllm() -> SimpleNamespace:
    made: list[FakeLLM] = []

    def llm(**kwargs: Any) -> FakeLLM:
        made.append(FakeLLM(kwargs))
        return made[-1]

    return SimpleNamespace(
        LLM=llm,
        SamplingParams=lambda **kw: SimpleNamespace(**kw),
        TokensPrompt=lambda prompt_token_ids: SimpleNamespace(prompt_token_ids=prompt_token_ids),
        made=made,
    )


@pytest.fixture
def engine(random_tiny_model: Path) -> tuple[VLLMEngine, FakeLLM]:
    module = fake_vllm()
    eng = VLLMEngine(random_tiny_model, vllm_module=module, max_model_len=128)  # type: ignore[arg-type]
    return eng, module.made[0]


def test_builds_llm_with_logprobs_mode_and_worker_extension(engine: tuple[VLLMEngine, FakeLLM]) -> None:
    eng, llm = engine
    assert isinstance(eng, Engine)
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["worker_extension_cls"] == WORKER_EXTENSION
    assert eng.info.kind == "vllm" and eng.info.vocab_size == 384 and eng.info.max_context == 128
    assert eng.info.eos_token_ids == [2]


def test_generate_maps_sampling_and_outputs(engine: tuple[VLLMEngine, FakeLLM]) -> None:
    eng, llm = engine
    out = eng.generate(
        [[10, 11], [20]], 2, SamplingSettings(max_tokens=5, temperature=0.7, top_p=0.9, seed=3)
    )
    _, (prompts, params) = llm.calls[-1]
    assert [p.prompt_token_ids for p in prompts] == [[10, 11], [20]]
    assert (params.n, params.temperature, params.top_p, params.max_tokens, params.seed, params.logprobs) == (
        2,
        0.7,
        0.9,
        5,
        3,
        0,
    )
    assert params.stop_token_ids == [2]
    gen = out.generation
    assert out.version == 0 and out.n == 2
    assert gen.completion_ids == [[10, 2], [7, 8, 9], [20, 2], [7, 8, 9]]
    assert gen.logprobs[0] == [-0.5, -1.0] and gen.logprobs[1] == [-0.5, -1.0, -1.5]
    assert gen.finish_reasons == ["stop", "length", "stop", "length"]
    eng.generate([[1]], 1, SamplingSettings(max_tokens=2, greedy=True))
    assert llm.calls[-1][1][1].temperature == 0.0


def test_same_request_checks_as_hf(engine: tuple[VLLMEngine, FakeLLM]) -> None:
    eng, llm = engine
    with pytest.raises(EngineRequestError, match="exceed the model's context of 128"):
        eng.generate([[1] * 100], 1, SamplingSettings(max_tokens=29))
    with pytest.raises(EngineRequestError, match="group_size"):
        eng.generate([[1]], 0, SamplingSettings(max_tokens=2))
    assert llm.calls == []


def test_weight_reload_checks_then_reloads_every_worker(
    engine: tuple[VLLMEngine, FakeLLM], tiny_checkpoints: dict[str, Path]
) -> None:
    eng, llm = engine
    for bad in ("truncated", "wrong_shape", "wrong_config", "nan"):
        with pytest.raises(WeightUpdateError):
            eng.load_checkpoint(tiny_checkpoints[bad])
    assert llm.calls == [] and eng.version == 0  # refused before touching the workers
    update = eng.load_checkpoint(tiny_checkpoints["perturbed1"])
    assert update.version == 1 and eng.version == 1
    assert llm.calls == [
        ("collective_rpc", ("cascade_load_checkpoint", (str(tiny_checkpoints["perturbed1"]),))),
        ("reset_prefix_cache", None),
    ]
    eng.load_tensors(read_checkpoint(tiny_checkpoints["perturbed2"]), version=9)
    assert llm.calls[-2][1][0] == "cascade_load_tensors" and eng.version == 9
    assert eng.generate([[1]], 1, SamplingSettings(max_tokens=2)).version == 9


def test_worker_extension_loads_through_the_model(tiny_checkpoints: dict[str, Path]) -> None:
    """What each vLLM worker runs: HF-named tensors handed to the model's `load_weights`."""
    import torch

    got: dict[str, torch.Tensor] = {}

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def load_weights(self, weights: Any) -> None:
            got.update(dict(weights))

    worker = CascadeWeightLoader()
    worker.model_runner = SimpleNamespace(model=Model())
    n = worker.cascade_load_checkpoint(str(tiny_checkpoints["perturbed1"]))
    assert n == len(got) > 0 and "model.embed_tokens.weight" in got


def test_missing_vllm_is_a_clear_error() -> None:
    if vllm_available():
        pytest.skip("vLLM is installed here")
    with pytest.raises(EngineUnavailableError, match="needs the `vllm` package"):
        import_vllm()


@pytest.mark.skipif(
    not vllm_available(), reason="vLLM is not installed (no GPU build on these machines): untested here"
)
def test_real_vllm_generates_and_reloads(tiny_checkpoints: dict[str, Path]) -> None:  # pragma: no cover
    eng = VLLMEngine(tiny_checkpoints["base"], dtype="float32", gpu_memory_utilization=0.3)
    sampling = SamplingSettings(max_tokens=8, seed=0)
    before = eng.generate([[1, 2, 3]], 4, sampling)
    assert eng.load_checkpoint(tiny_checkpoints["perturbed1"]).version == 1
    after = eng.generate([[1, 2, 3]], 4, sampling)
    assert after.version == 1 and after.generation.logprobs != before.generation.logprobs

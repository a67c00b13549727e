"""The vLLM engine's own logic against a stand-in `vllm` module that records what the engine
asks of it: sampling-parameter mapping, output conversion, settings and their errors, checks
before a weight reload, the reload calls, versions. Real vLLM (the CPU build in `.venv-vllm`)
runs in `tests/integration/test_vllm_*.py`; the main environment has no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cascade.config import VllmEngineConfig
from cascade.engine.base import Engine, EngineRequestError, SamplingSettings, WeightUpdateError
from cascade.engine.vllm import (
    WORKER_EXTENSION,
    EngineUnavailableError,
    VLLMEngine,
    VllmSettingsError,
    import_vllm,
    resolve_settings,
    staging_dir,
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
    reloaded: list[dict[str, Any]] = field(default_factory=list)

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
        self.reloaded.append(read_checkpoint(args[0]))  # what a worker would read, while it exists
        return [None]

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache", None))


def fake_vllm(cpu: bool = True) -> SimpleNamespace:
    made: list[FakeLLM] = []

    def llm(**kwargs: Any) -> FakeLLM:
        made.append(FakeLLM(kwargs))
        return made[-1]

    return SimpleNamespace(
        LLM=llm,
        SamplingParams=lambda **kw: SimpleNamespace(**kw),
        TokensPrompt=lambda prompt_token_ids: SimpleNamespace(prompt_token_ids=prompt_token_ids),
        made=made,
        platforms=SimpleNamespace(current_platform=SimpleNamespace(is_cpu=lambda: cpu)),
    )


@pytest.fixture
def engine(random_tiny_model: Path) -> tuple[VLLMEngine, FakeLLM]:
    module = fake_vllm()
    settings = VllmEngineConfig(max_model_len=128)
    eng = VLLMEngine(random_tiny_model, settings=settings, vllm_module=module)  # type: ignore[arg-type]
    return eng, module.made[0]


def test_builds_llm_with_logprobs_mode_and_worker_extension(engine: tuple[VLLMEngine, FakeLLM]) -> None:
    eng, llm = engine
    assert isinstance(eng, Engine)
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["worker_extension_cls"] == WORKER_EXTENSION
    assert llm.kwargs["enable_prefix_caching"] is True  # multi-turn rounds reuse their context
    assert eng.info.kind == "vllm" and eng.info.vocab_size == 384 and eng.info.max_context == 128
    assert eng.info.eos_token_ids == [2]


def test_platform_defaults_and_explicit_settings(random_tiny_model: Path) -> None:
    cpu, gpu = fake_vllm(cpu=True), fake_vllm(cpu=False)
    VLLMEngine(random_tiny_model, vllm_module=cpu)  # type: ignore[arg-type]
    VLLMEngine(random_tiny_model, vllm_module=gpu)  # type: ignore[arg-type]
    on_cpu, on_gpu = cpu.made[0].kwargs, gpu.made[0].kwargs
    assert (on_cpu["dtype"], on_cpu["enforce_eager"], on_cpu["kv_cache_memory_bytes"]) == (
        "float32",
        True,
        2**30,
    )
    assert (on_gpu["dtype"], on_gpu["enforce_eager"]) == ("bfloat16", False)
    assert "kv_cache_memory_bytes" not in on_gpu and on_gpu["gpu_memory_utilization"] == 0.85
    # CPU: no chunked prefill (seeded requests over one step's budget killed the engine core)
    assert (on_cpu["enable_chunked_prefill"], on_cpu["max_num_batched_tokens"]) == (False, 4096)
    assert "enable_chunked_prefill" not in on_gpu
    assert on_cpu["max_model_len"] == 256  # the model's max_position_embeddings
    settings = VllmEngineConfig(
        dtype="bfloat16",
        enforce_eager=False,
        kv_cache_gib=0.5,
        max_model_len=64,
        tensor_parallel_size=2,
        seed=4,
    )
    VLLMEngine(random_tiny_model, settings=settings, vllm_module=cpu)  # type: ignore[arg-type]
    mine = cpu.made[1].kwargs
    assert (mine["dtype"], mine["enforce_eager"], mine["kv_cache_memory_bytes"]) == ("bfloat16", False, 2**29)
    assert (mine["max_model_len"], mine["tensor_parallel_size"], mine["seed"]) == (64, 2, 4)


def test_bad_settings_name_the_field() -> None:
    config = {"max_position_embeddings": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
    with pytest.raises(VllmSettingsError, match="max_model_len: 512 is over the model's max_position"):
        resolve_settings(VllmEngineConfig(max_model_len=512), config, on_cpu=True)
    with pytest.raises(
        VllmSettingsError, match="tensor_parallel_size: 4 does not divide .*num_key_value_heads"
    ):
        resolve_settings(VllmEngineConfig(tensor_parallel_size=4), config, on_cpu=False)
    with pytest.raises(VllmSettingsError, match="dtype: float16 is not supported by vLLM's CPU build"):
        resolve_settings(VllmEngineConfig(dtype="float16"), config, on_cpu=True)
    for field_name, value in (("kv_cache_gib", 0), ("tensor_parallel_size", 0), ("dtype", "fp8")):
        with pytest.raises(ValueError, match=field_name):
            VllmEngineConfig(**{field_name: value})


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
        ("collective_rpc", ("cascade_reload", (str(tiny_checkpoints["perturbed1"]),))),
        ("reset_prefix_cache", None),
    ]
    streamed = read_checkpoint(tiny_checkpoints["perturbed2"])
    eng.load_tensors(streamed, version=9)
    method, (path,) = llm.calls[-2][1]
    assert method == "cascade_reload" and path.endswith(".safetensors") and eng.version == 9
    assert not Path(path).exists()  # the shared-memory file is gone after the reload
    assert set(llm.reloaded[-1]) == set(streamed)
    assert all(bool((llm.reloaded[-1][k] == t).all()) for k, t in streamed.items())
    assert eng.generate([[1]], 1, SamplingSettings(max_tokens=2)).version == 9


def test_worker_extension_reloads_then_refreshes_a_tied_head(tiny_checkpoints: dict[str, Path]) -> None:
    """What each vLLM worker runs: vLLM's reload_weights over the checkpoint's tensors, then the
    tied head's post-processing again (its packed copy of the embedding is stale otherwise)."""
    import torch

    got: dict[str, torch.Tensor] = {}
    processed: list[Any] = []

    class Head(torch.nn.Module):
        def __init__(self, weight: torch.nn.Parameter) -> None:
            super().__init__()
            self.weight = weight
            self.quant_method = SimpleNamespace(process_weights_after_loading=processed.append)

    class Model(torch.nn.Module):
        def __init__(self, tied: bool) -> None:
            super().__init__()
            self.model = SimpleNamespace(
                embed_tokens=SimpleNamespace(weight=torch.nn.Parameter(torch.ones(2)))
            )
            embed = self.model.embed_tokens.weight
            self.lm_head = Head(embed if tied else torch.nn.Parameter(torch.ones(2)))

    for tied in (True, False):
        model = Model(tied)
        worker = CascadeWeightLoader()
        worker.model_runner = SimpleNamespace(get_model=lambda m=model: m)
        worker.reload_weights = lambda weights_iterator, is_checkpoint_format: got.update(weights_iterator)
        processed.clear()
        n = worker.cascade_reload(str(tiny_checkpoints["perturbed1"]))
        assert n == len(got) > 0 and "model.embed_tokens.weight" in got
        assert processed == ([model.lm_head] if tied else [])


def test_missing_vllm_is_a_clear_error() -> None:
    if vllm_available():
        pytest.skip("vLLM is installed here")
    with pytest.raises(EngineUnavailableError, match="needs the `vllm` package"):
        import_vllm()


def test_rollout_cli_vllm_settings_and_their_errors(random_tiny_model: Path, capsys: Any) -> None:
    """`cascade-rollout --engine vllm` builds its VllmEngineConfig from flags and refuses bad ones
    at once, naming the flag (before vLLM is imported)."""
    from services.rollout.main import parse_args

    model = ["--model", str(random_tiny_model), "--engine", "vllm"]
    args = parse_args([*model, "--kv-cache-gib", "0.5", "--no-enforce-eager", "--max-model-len", "128"])
    assert args.vllm_settings == VllmEngineConfig(kv_cache_gib=0.5, enforce_eager=False, max_model_len=128)
    assert parse_args(model).vllm_settings == VllmEngineConfig()  # platform defaults at start
    for flags, message in (
        (
            ["--max-model-len", "999"],
            "--max-model-len: 999 is over the model's max_position_embeddings (256)",
        ),
        (["--tensor-parallel-size", "3"], "--tensor-parallel-size: 3 does not divide"),
        (["--kv-cache-gib", "0"], "--kv-cache-gib: Input should be greater than 0"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: Input should be less than"),
    ):
        with pytest.raises(SystemExit):
            parse_args([*model, *flags])
        assert message in capsys.readouterr().err


def test_streamed_weights_stage_in_shared_memory_only_when_it_has_room(tmp_path: Path) -> None:
    import shutil

    free = shutil.disk_usage(tmp_path).free
    assert staging_dir(1000, shm=str(tmp_path)) == str(tmp_path)
    assert staging_dir(free, shm=str(tmp_path)) is None  # no room: the default temp dir
    assert staging_dir(1000, shm=str(tmp_path / "absent")) is None

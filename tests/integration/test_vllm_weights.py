"""Real vLLM (CPU build): weight updates in place equal a fresh engine, token for token.

Every matrix of the checkpoints is perturbed (embedding, attention, MLP, norms and, untied, the
head): scaling one matrix would not do, greedy argmax ignores a scaled head. The tied model is
the one `cascade model init` builds (lm_head shares the embedding); a CPU reload that forgot
the head's packed copy would still score with the old embedding. A checkpoint of the wrong
shape or with NaN is refused and the engine serves the old weights.

One driver process (`vllm_procs.VllmDriver`) for the module, one engine in it at a time.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from vllm_procs import DriverError, VllmDriver, require_vllm_env

pytestmark = pytest.mark.timeout(2400)

GREEDY = {"max_tokens": 24, "greedy": True}


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmDriver]:
    require_vllm_env()
    d = VllmDriver(tmp_path_factory.mktemp("vllm-weights"))
    yield d
    d.stop()


def prompts(vocab: int, count: int = 16, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (count,), generator=gen).tolist()
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def perturbed(base: Path, out: Path, seed: int, scale: float = 0.05) -> Path:
    """`base` with noise on every tensor (same config)."""
    shutil.copytree(base, out)
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(base / "model.safetensors"))
    noisy = {n: t + scale * torch.randn(t.shape, generator=gen) for n, t in weights.items()}
    save_file(noisy, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def untied(base: Path, out: Path) -> Path:
    """`base` with its own lm_head (a copy of the embedding plus noise) and tie_word_embeddings off."""
    shutil.copytree(base, out)
    weights = load_file(str(base / "model.safetensors"))
    gen = torch.Generator().manual_seed(7)
    embed = weights["model.embed_tokens.weight"]
    weights["lm_head.weight"] = embed + 0.05 * torch.randn(embed.shape, generator=gen)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return out


def same(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Greedy outputs equal token for token, and their log-probs equal (to 1e-5; the largest
    difference is returned: 0 where the reload reproduces the fresh engine's bits)."""
    assert a["completion_ids"] == b["completion_ids"]
    assert a["finish_reasons"] == b["finish_reasons"]
    for x, y in zip(a["logprobs"], b["logprobs"], strict=True):
        assert x == pytest.approx(y, abs=1e-5, rel=0)
    pairs = zip(sum(a["logprobs"], []), sum(b["logprobs"], []), strict=True)
    return max(abs(u - v) for u, v in pairs)


def differ(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["completion_ids"] != b["completion_ids"]


def test_tied_head_updates_by_path_and_stream_equal_a_fresh_engine(
    driver: VllmDriver, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    base = tiny_checkpoints["base"]
    vocab = json.loads((base / "config.json").read_text())["vocab_size"]
    assert json.loads((base / "config.json").read_text())["tie_word_embeddings"] is True
    p1, p2 = tiny_checkpoints["perturbed1"], tiny_checkpoints["perturbed2"]
    batch = prompts(vocab)

    assert driver.start(base)["version"] == 0
    g0 = driver.generate(batch, 1, **GREEDY)
    for bad, why in (("wrong_shape", "shape"), ("nan", "NaN"), ("wrong_config", "num_hidden_layers")):
        with pytest.raises(DriverError, match=why) as refused:
            driver.call(op="load_checkpoint", path=str(tiny_checkpoints[bad]))
        assert refused.value.error == "WeightUpdateError"
        if bad != "wrong_config":  # streamed tensors carry no config
            with pytest.raises(DriverError, match=why):
                driver.call(op="load_tensors", path=str(tiny_checkpoints[bad]))
    still = driver.generate(batch, 1, **GREEDY)
    assert still["version"] == 0
    same(still, g0)  # refused updates left the old weights serving

    update = driver.call(op="load_tensors", path=str(p1))
    assert update["version"] == 1
    print(f"tied: streamed update {update['seconds']:.2f} s")
    streamed = driver.generate(batch, 1, **GREEDY)
    assert streamed["version"] == 1 and differ(streamed, g0)
    update = driver.call(op="load_checkpoint", path=str(p2), version=5)
    assert update["version"] == 5
    print(f"tied: update by path {update['seconds']:.2f} s")
    by_path = driver.generate(batch, 1, **GREEDY)
    assert by_path["version"] == 5 and differ(by_path, streamed)
    with pytest.raises(DriverError, match="not above the current version 5"):
        driver.call(op="load_checkpoint", path=str(p1), version=5)
    assert driver.call(op="load_checkpoint", path=str(p1))["version"] == 6
    same(driver.generate(batch, 1, **GREEDY), streamed)  # streamed == by path, same weights

    started = driver.start(p2)
    gap = same(driver.generate(batch, 1, **GREEDY), by_path)  # updated in place == fresh engine
    print(f"tied: engine start {started['seconds']:.1f} s, max |log-prob| updated vs fresh {gap:.1e}")


def test_untied_head_update_equals_a_fresh_engine(
    driver: VllmDriver, tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    base = untied(tiny_checkpoints["base"], tmp_path / "untied")
    target = perturbed(base, tmp_path / "untied-perturbed", seed=3)
    vocab = json.loads((base / "config.json").read_text())["vocab_size"]
    batch = prompts(vocab, seed=1)

    driver.start(base)
    before = driver.generate(batch, 1, **GREEDY)
    assert driver.call(op="load_tensors", path=str(target))["version"] == 1
    updated = driver.generate(batch, 1, **GREEDY)
    assert differ(updated, before)
    driver.start(target)
    gap = same(driver.generate(batch, 1, **GREEDY), updated)
    print(f"untied: max |log-prob| updated vs fresh {gap:.1e}")

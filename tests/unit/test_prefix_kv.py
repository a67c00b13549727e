"""`cascade.engine.prefix_kv`: a prefill on top of a cached prefix agrees with a full prefill,
the cache is bounded by bytes, and a weight change invalidates it (no stale keys/values)."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from cascade.engine.prefix_kv import PrefixKV, prefill

pytestmark = pytest.mark.usefixtures("torch_one_thread")

VOCAB = 97


def _model() -> PreTrainedModel:
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def _full(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_reused_prefill_matches_full_prefill_over_rounds() -> None:
    model = _model()
    cache = PrefixKV()
    context = _ids(40, 1)
    logits, _, reused = prefill(model, context, cache)
    assert reused == 0
    torch.testing.assert_close(logits, _full(model, context), atol=1e-5, rtol=0)
    for r in range(3):  # each round: the context grows by a turn and the environment's ids
        context = context + _ids(30, 10 + r)
        logits, kv, reused = prefill(model, context, cache)
        assert reused == len(context) - 30
        assert kv.get_seq_length() == len(context)
        full = _full(model, context)
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)
        assert torch.equal(logits.argmax(), full.argmax())
        assert torch.equal(
            torch.log_softmax(logits, -1).topk(5).indices, torch.log_softmax(full, -1).topk(5).indices
        )
    assert cache.hits == 3 and cache.misses == 1


def test_weight_change_invalidates() -> None:
    model = _model()
    cache = PrefixKV()
    context = _ids(40, 2)
    prefill(model, context, cache)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)  # what an optimizer step does: in place
    longer = context + _ids(10, 3)
    logits, _, reused = prefill(model, longer, cache)
    assert reused == 0
    torch.testing.assert_close(logits, _full(model, longer), atol=1e-5, rtol=0)
    model.load_state_dict(_model().state_dict())
    _, _, reused = prefill(model, longer + [5], cache)
    assert reused == 0


def test_bounded_by_bytes() -> None:
    model = _model()
    one = PrefixKV()
    prefill(model, _ids(20, 4), one)
    per_entry = one.nbytes
    cap = 5 * per_entry // 2  # two entries and a half: a third evicts the oldest
    cache = PrefixKV(max_bytes=cap)
    for seed in range(5):
        prefill(model, _ids(20, 10 + seed), cache)
        assert cache.nbytes <= cap
    assert len(cache) == 2
    _, _, reused = prefill(model, _ids(20, 10) + [3], cache)  # the oldest was evicted
    assert reused == 0
    _, _, reused = prefill(model, _ids(20, 14) + [3], cache)  # the newest is still there
    assert reused == 20

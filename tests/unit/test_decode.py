"""The fast generation paths agree with the Hugging Face forward and with the learner.

`cascade.engine.decode.StaticDecoder` (the static-cache decode step), the shared prefill of
repeated prompts, dropping finished rows, the inverse-CDF sampler and the learner's shared
prompt forward are each checked against the plain computation, on a small random model of
every architecture the decoder supports.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from cascade.engine import decode
from cascade.engine.batch import build_batch
from cascade.engine.hf import generate
from cascade.engine.logprobs import completion_logits, gather_logprobs
from cascade.engine.sampling import inverse_cdf

pytestmark = pytest.mark.usefixtures("torch_one_thread")

VOCAB = 97
PAD = 0
ARCHS = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q/k/v biases
    "llama": (LlamaConfig, LlamaForCausalLM),  # no q/k norms
}


def _model(kind: str, **extra: object) -> PreTrainedModel:
    config_cls, model_cls = ARCHS[kind]
    cfg = config_cls(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=PAD,
        **extra,
    )
    torch.manual_seed(0)
    return model_cls(cfg).eval()


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    distinct = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 11, 8)]
    return [distinct[i] for i in (0, 0, 1, 2, 1, 0, 2, 2, 1, 1, 0, 2)]  # repeated, in no particular order


def _sample(model: PreTrainedModel, prompts: list[list[int]], eos: list[int], seed: int = 5, **kw: object):
    kw.setdefault("temperature", 0.8)
    return generate(
        model,
        prompts,
        max_new_tokens=16,
        eos_ids=eos,
        pad_id=PAD,
        generator=torch.Generator().manual_seed(seed),
        **kw,  # type: ignore[arg-type]
    )


def _learner(model: PreTrainedModel, prompts, completions, temperature: float) -> list[list[float]]:
    sb = build_batch(prompts, completions, PAD)
    with torch.no_grad():
        lp = gather_logprobs(completion_logits(model, sb, temperature), sb.completion_ids)
    return [lp[i, : len(c)].tolist() for i, c in enumerate(completions)]


def _close(a: list[list[float]], b: list[list[float]], tol: float) -> None:
    assert [len(r) for r in a] == [len(r) for r in b]
    for ra, rb in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(ra), torch.tensor(rb), atol=tol, rtol=0)


EOS_MANY = list(range(1, VOCAB, 11))
"""About a tenth of the vocabulary: rows stop at different steps, so finished rows are dropped."""


@pytest.mark.parametrize("kind", list(ARCHS))
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_static_decoder_equals_the_hf_forward(
    kind: str, top_p: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(kind)
    assert decode.supports(model)
    prompts = _prompts()
    fast = _sample(model, prompts, EOS_MANY, top_p=top_p)
    assert "stop" in fast.finish_reasons and "length" in fast.finish_reasons, fast.finish_reasons
    monkeypatch.setattr(decode, "supports", lambda _model: False)
    slow = _sample(model, prompts, EOS_MANY, top_p=top_p)
    assert fast.completion_ids == slow.completion_ids
    assert fast.finish_reasons == slow.finish_reasons
    _close(fast.logprobs, slow.logprobs, 1e-5)


@pytest.mark.parametrize("kind", list(ARCHS))
def test_generation_logprobs_match_the_shared_prompt_learner(kind: str) -> None:
    model = _model(kind)
    prompts = _prompts()
    gen = _sample(model, prompts, EOS_MANY, temperature=0.7)
    _close(gen.logprobs, _learner(model, prompts, gen.completion_ids, 0.7), 1e-4)


@pytest.mark.parametrize("kind", list(ARCHS))
def test_shared_prompt_forward_equals_the_plain_one_with_gradients(kind: str) -> None:
    model = _model(kind).train()
    prompts = _prompts()
    gen = _sample(model, prompts, [10**6])
    sb = build_batch(prompts, gen.completion_ids, PAD)
    shared = completion_logits(model, sb, 0.9)
    (shared.log_softmax(-1) * sb.completion_mask[..., None]).sum().backward()
    grads_shared = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    out = model(input_ids=sb.input_ids, attention_mask=sb.attention_mask, position_ids=sb.position_ids)
    p, c = sb.prompt_len, sb.completion_ids.shape[1]
    plain = out.logits[:, p - 1 : p - 1 + c].float() / 0.9
    (plain.log_softmax(-1) * sb.completion_mask[..., None]).sum().backward()
    grads_plain = [p.grad for p in model.parameters() if p.grad is not None]
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)
    assert len(grads_shared) == len(grads_plain)
    # Gradients sum over every completion token in another order on the two paths: on this
    # machine's CPU one element of 6208 differed by 1.15e-5 (the landed tree too), so 5e-5.
    for a, b in zip(grads_shared, grads_plain, strict=True):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)


def test_repeated_prompts_share_one_prefill_and_decode_like_single_ones() -> None:
    model = _model("qwen3")
    prompts = _prompts()
    together = generate(model, prompts, max_new_tokens=10, eos_ids=[10**6], pad_id=PAD, greedy=True)
    for prompt, completion, lps in zip(prompts, together.completion_ids, together.logprobs, strict=True):
        alone = generate(model, [prompt], max_new_tokens=10, eos_ids=[10**6], pad_id=PAD, greedy=True)
        assert alone.completion_ids[0] == completion
        _close(alone.logprobs, [lps], 1e-5)


def test_a_row_stopping_never_changes_the_other_rows() -> None:
    model = _model("qwen3")
    prompts = _prompts()
    ref = _sample(model, prompts, [10**6])
    stop_at = ref.completion_ids[0][2]
    gen = _sample(model, prompts, [stop_at])
    for r, g in zip(ref.completion_ids, gen.completion_ids, strict=True):
        cut = r.index(stop_at) + 1 if stop_at in r else len(r)
        assert g == r[:cut]


def test_sliding_window_models_take_the_hf_forward() -> None:
    model = _model(
        "qwen3",
        use_sliding_window=True,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    )
    assert not decode.supports(model)
    prompts = _prompts()
    gen = _sample(model, prompts, EOS_MANY)
    _close(gen.logprobs, _learner(model, prompts, gen.completion_ids, 0.8), 1e-4)


def test_inverse_cdf_never_draws_a_zero_weight() -> None:
    weights = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]] * 4)
    uniform = torch.tensor([0.0, 0.3, 0.5, torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)).item()])
    assert inverse_cdf(weights, uniform).tolist() == [1, 3, 3, 3]
    assert inverse_cdf(weights[:1], torch.tensor([0.2999])).tolist() == [1]


def test_inverse_cdf_draws_in_proportion() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    n = 40_000
    draws = inverse_cdf(probs.expand(n, -1), torch.rand(n, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(draws, minlength=4).float() / n
    assert freq[1] == 0
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)


def test_shared_prompt_forward_is_bitwise_the_same_for_a_frozen_copy() -> None:
    """A policy (weights that require grad) and its frozen copy (KL reference, teacher) give the
    same bits: at a stage's first step the policy is its reference, KL and its gradient exactly 0."""
    model = _model("qwen3")
    frozen = copy.deepcopy(model)
    for p in frozen.parameters():
        p.requires_grad_(False)
    prompts = _prompts()
    gen = _sample(model, prompts, [10**6])
    sb = build_batch(prompts, gen.completion_ids, PAD)
    with torch.no_grad():
        assert torch.equal(completion_logits(model, sb), completion_logits(frozen, sb))
    assert torch.equal(completion_logits(model.train(), sb).detach(), completion_logits(frozen, sb))

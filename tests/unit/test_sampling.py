"""One sampling function for both HF sampling paths, correct on any device.

The policy in the learner's process (`PolicyGenerate`) and the HF engine behind the rollout
service both go through `sample_request`; seeded requests draw from a CPU generator whose
draws are moved to the logits' device. Off a GPU, the `meta` device stands in for "not the
generator's device" (where the outputs land); the CUDA test runs where a GPU is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cascade.engine.base import SamplingSettings
from cascade.engine.hf import generate
from cascade.engine.hf_engine import HFEngine, sample_request
from cascade.engine.sampling import draw_uniform, inverse_cdf, next_tokens, request_generator
from cascade.model.loading import Policy, load_policy
from cascade.rollout.policy import PolicyGenerate

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[5, 9, 13, 17, 21], [4, 8], [30, 31, 32, 33, 34, 35, 36]]
META = torch.device("meta")


@pytest.fixture(scope="module")
def policy(random_tiny_model: Path) -> Policy:
    return load_policy(random_tiny_model)


def _logits(rows: int = 6, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return 3 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def test_draws_land_on_the_target_device_not_the_generators() -> None:
    """On CUDA, `torch.rand(..., generator=cpu_generator, device="cuda")` (what the old decode loop
    did with the learner's CPU generator) raises "Expected a 'cuda' device type for generator";
    `draw_uniform` draws on the generator's device and moves the draws."""
    assert draw_uniform(4, request_generator(0), META).device == META
    assert draw_uniform(4, None, META).device == META


def test_draws_are_the_cpu_stream_of_the_seed_whatever_the_target_device() -> None:
    expected = torch.rand(8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(draw_uniform(8, request_generator(3), torch.device("cpu")), expected)
    assert draw_uniform(8, request_generator(3), META).shape == expected.shape
    assert not torch.equal(draw_uniform(8, request_generator(4), torch.device("cpu")), expected)


def test_next_tokens_stay_on_the_logits_device() -> None:
    logits = _logits().to(META)
    uniform = draw_uniform(logits.shape[0], request_generator(1), logits.device)
    for top_p in (1.0, 0.8):
        tok, lp = next_tokens(logits, temperature=0.7, top_p=top_p, uniform=uniform)
        assert tok.device == META and lp.device == META
        assert tok.shape == lp.shape == (logits.shape[0],)


def test_next_tokens_logprobs_are_the_full_vocabulary_at_the_temperature() -> None:
    logits = _logits()
    uniform = draw_uniform(logits.shape[0], request_generator(2), logits.device)
    for t, top_p in ((1.0, 1.0), (0.7, 1.0), (0.7, 0.5)):
        tok, lp = next_tokens(logits, temperature=t, top_p=top_p, uniform=uniform)
        full = torch.log_softmax(logits / t, dim=-1)
        assert torch.equal(lp, full.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
    tok, _ = next_tokens(logits, temperature=0.7, top_p=1.0, uniform=None)
    assert torch.equal(tok, logits.argmax(-1))


def test_top_p_samples_only_inside_the_nucleus() -> None:
    logits = _logits(rows=1, seed=4).expand(4000, -1)
    probs = torch.softmax(logits[0] / 0.9, dim=-1)
    sorted_p, order = probs.sort(descending=True)
    nucleus = set(order[: int((sorted_p.cumsum(0) - sorted_p < 0.6).sum())].tolist())
    uniform = draw_uniform(logits.shape[0], request_generator(5), logits.device)
    tok, _ = next_tokens(logits, temperature=0.9, top_p=0.6, uniform=uniform)
    assert set(tok.tolist()) <= nucleus and len(set(tok.tolist())) > 1
    full, _ = next_tokens(logits, temperature=0.9, top_p=1.0, uniform=uniform)
    assert len(set(full.tolist())) > len(nucleus)


def test_next_tokens_are_the_inverse_cdf_of_the_draws() -> None:
    """The sampler the decode loop always had: inverse CDF of the row's probabilities."""
    logits = _logits()
    uniform = draw_uniform(logits.shape[0], request_generator(6), logits.device)
    tok, _ = next_tokens(logits, temperature=0.8, top_p=1.0, uniform=uniform)
    assert torch.equal(tok, inverse_cdf(torch.softmax(logits / 0.8, dim=-1), uniform))


def test_same_seed_same_tokens_in_the_learner_process_and_the_engine(
    policy: Policy, random_tiny_model: Path
) -> None:
    sampling = SamplingSettings(max_tokens=10, temperature=0.9, top_p=0.95, seed=123)
    embedded = PolicyGenerate(policy, generator=torch.Generator().manual_seed(999))(PROMPTS, 3, sampling)
    engine = HFEngine.from_dir(random_tiny_model).generate(PROMPTS, 3, sampling)
    assert embedded.generation.completion_ids == engine.generation.completion_ids
    assert embedded.generation.logprobs == engine.generation.logprobs  # bitwise
    again = PolicyGenerate(policy)(PROMPTS, 3, sampling)
    assert again.generation.completion_ids == embedded.generation.completion_ids
    other = PolicyGenerate(policy)(PROMPTS, 3, SamplingSettings(max_tokens=10, temperature=0.9, seed=124))
    assert other.generation.completion_ids != embedded.generation.completion_ids


def test_seeded_request_is_the_cpu_generator_of_its_seed(policy: Policy) -> None:
    """On the CPU the tokens are those `generate` samples with `torch.Generator().manual_seed(seed)`
    (what both paths did before they shared one function)."""
    sampling = SamplingSettings(max_tokens=10, temperature=0.8, seed=7)
    got = sample_request(
        policy.model, PROMPTS, 2, sampling, eos_ids=policy.eos_token_ids, pad_id=policy.pad_token_id
    )
    ref = generate(
        policy.model,
        [p for p in PROMPTS for _ in range(2)],
        max_new_tokens=10,
        eos_ids=policy.eos_token_ids,
        pad_id=policy.pad_token_id,
        temperature=0.8,
        generator=torch.Generator().manual_seed(7),
    )
    assert got.completion_ids == ref.completion_ids and got.logprobs == ref.logprobs


def test_an_unseeded_request_samples_from_the_given_generator(policy: Policy) -> None:
    sampling = SamplingSettings(max_tokens=8, temperature=1.0)
    a = PolicyGenerate(policy, generator=torch.Generator().manual_seed(31))(PROMPTS, 2, sampling)
    b = PolicyGenerate(policy, generator=torch.Generator().manual_seed(31))(PROMPTS, 2, sampling)
    assert a.generation.completion_ids == b.generation.completion_ids


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_requests_on_a_cuda_model(random_tiny_model: Path) -> None:
    gpu = load_policy(random_tiny_model, device="cuda")
    sampling = SamplingSettings(max_tokens=10, temperature=0.9, seed=123)
    embedded = PolicyGenerate(gpu)(PROMPTS, 3, sampling)
    engine = HFEngine.from_dir(random_tiny_model, device="cuda").generate(PROMPTS, 3, sampling)
    assert embedded.generation.completion_ids == engine.generation.completion_ids
    unseeded = PolicyGenerate(gpu, generator=torch.Generator(device="cuda").manual_seed(1))
    assert len(unseeded(PROMPTS, 3, SamplingSettings(max_tokens=10)).generation.completion_ids) == 9

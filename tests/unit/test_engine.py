"""The rollout engine (KV-cache sampling) and the learner forward agree on log-probs.

Runs on the random tiny model: what matters is the plumbing (padding, positions, cache,
temperature, top-p), not what the model says.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cascade.config import ChatConfig
from cascade.engine.batch import build_batch, left_pad, positions, right_pad
from cascade.engine.hf import generate
from cascade.engine.logprobs import completion_logprobs
from cascade.model.chat import encode_prompts
from cascade.model.loading import Policy, load_policy

PROMPTS = [
    "What is 12+34?",
    "Write a sentence about cats in lowercase letters only, without any commas, ending with a period.",
    "Hi",
]
NEVER = [10**9]
"""An EOS id no model can produce: every row runs to the token budget."""

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def policy(random_tiny_model: Path) -> Policy:
    torch.manual_seed(0)
    return load_policy(random_tiny_model)


@pytest.fixture(scope="module")
def prompt_ids(policy: Policy) -> list[list[int]]:
    ids = encode_prompts(policy.tokenizer, ChatConfig(), PROMPTS, thinking=False)
    assert len({len(p) for p in ids}) == len(ids), "the prompts must have different lengths"
    return ids


def _gen(policy: Policy, prompts: list[list[int]], **kw) -> object:
    kw.setdefault("max_new_tokens", 12)
    kw.setdefault("eos_ids", policy.eos_token_ids)
    return generate(policy.model, prompts, pad_id=policy.pad_token_id, **kw)


def _learner_logprobs(policy: Policy, prompts, completions, temperature: float) -> list[list[float]]:
    sb = build_batch(prompts, completions, policy.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(policy.model, sb, temperature)
    return [lp[i, : len(c)].tolist() for i, c in enumerate(completions)]


def _assert_close(a: list[list[float]], b: list[list[float]], tol: float) -> None:
    assert [len(r) for r in a] == [len(r) for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(ra), torch.tensor(rb), atol=tol, rtol=0), (ra, rb)


# --------------------------------------------------------------------------- engine == learner


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 0.9), (1.0, 1.0)])
def test_generation_logprobs_match_learner(
    policy: Policy, prompt_ids: list[list[int]], temperature: float, top_p: float
) -> None:
    gen = _gen(
        policy,
        prompt_ids,
        temperature=temperature,
        top_p=top_p,
        generator=torch.Generator().manual_seed(1),
        eos_ids=NEVER,
    )
    assert all(len(c) == 12 for c in gen.completion_ids)
    learner = _learner_logprobs(policy, prompt_ids, gen.completion_ids, temperature)
    _assert_close(gen.logprobs, learner, 1e-4)
    # Log-probs are at the sampling temperature: not the temperature-1 ones.
    if temperature != 1.0:
        at_one = _learner_logprobs(policy, prompt_ids, gen.completion_ids, 1.0)
        diff = (torch.tensor(gen.logprobs) - torch.tensor(at_one)).abs().max()
        assert diff > 1e-3


def _sampled(policy: Policy, prompts: list[list[int]], eos_ids: list[int], n: int = 10):
    return _gen(
        policy,
        prompts,
        temperature=0.7,
        top_p=0.9,
        max_new_tokens=n,
        eos_ids=eos_ids,
        generator=torch.Generator().manual_seed(11),
    )


def _early_stop_token(completions: list[list[int]]) -> int:
    """A token of row 0 (at position 1 or later) that no other row produces."""
    others = {t for row in completions[1:] for t in row}
    for tok in completions[0][1:5]:
        if tok not in others and completions[0].index(tok) >= 1:
            return tok
    pytest.fail(f"no row-0 token to stop on in {completions}")


def test_logprobs_match_learner_with_early_stop(policy: Policy, prompt_ids: list[list[int]]) -> None:
    """Rows that stop early are right-padded; log-probs of every row still agree."""
    ref = _sampled(policy, prompt_ids, NEVER)
    stop = _early_stop_token(ref.completion_ids)
    gen = _sampled(policy, prompt_ids, [stop])
    assert gen.finish_reasons[0] == "stop"
    assert gen.finish_reasons[1:] == ["length"] * (len(prompt_ids) - 1)
    assert len(gen.completion_ids[0]) < len(gen.completion_ids[1]) == 10
    learner = _learner_logprobs(policy, prompt_ids, gen.completion_ids, 0.7)
    _assert_close(gen.logprobs, learner, 1e-4)


# --------------------------------------------------------------------------- determinism


def _argmax_path(policy: Policy, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding without a cache or padding: one full forward per token."""
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = policy.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            tok = int(logits.argmax())
            out.append(tok)
            ids.append(tok)
    return out


def test_greedy_is_deterministic_and_the_argmax_path(policy: Policy, prompt_ids: list[list[int]]) -> None:
    a = _gen(policy, prompt_ids, greedy=True, eos_ids=NEVER)
    b = _gen(policy, prompt_ids, greedy=True, eos_ids=NEVER)
    assert a.completion_ids == b.completion_ids
    assert a.logprobs == b.logprobs
    for prompt, completion in zip(prompt_ids, a.completion_ids, strict=True):
        assert completion == _argmax_path(policy, prompt, 12)


def test_sampling_reproducible_with_same_seed(policy: Policy, prompt_ids: list[list[int]]) -> None:
    def sample(seed: int):
        return _gen(
            policy,
            prompt_ids,
            temperature=0.7,
            top_p=0.9,
            generator=torch.Generator().manual_seed(seed),
            eos_ids=NEVER,
        )

    a, b, c = sample(123), sample(123), sample(456)
    assert a.completion_ids == b.completion_ids
    assert a.logprobs == b.logprobs
    assert a.completion_ids != c.completion_ids


def test_top_p_keeps_only_the_nucleus(policy: Policy, prompt_ids: list[list[int]]) -> None:
    """With a tiny top_p only the most likely token survives: sampling equals greedy."""
    greedy = _gen(policy, prompt_ids, greedy=True, eos_ids=NEVER)
    sampled = _gen(policy, prompt_ids, top_p=1e-6, generator=torch.Generator().manual_seed(7), eos_ids=NEVER)
    assert sampled.completion_ids == greedy.completion_ids


def test_generation_restores_training_mode(policy: Policy, prompt_ids: list[list[int]]) -> None:
    policy.model.train()
    try:
        _gen(policy, prompt_ids[:1], greedy=True, max_new_tokens=2)
        assert policy.model.training
    finally:
        policy.model.eval()


# --------------------------------------------------------------------------- finish reasons


def test_finish_reason_length(policy: Policy, prompt_ids: list[list[int]]) -> None:
    gen = _gen(policy, prompt_ids, greedy=True, max_new_tokens=5, eos_ids=NEVER)
    assert gen.finish_reasons == ["length"] * len(prompt_ids)
    assert [len(c) for c in gen.completion_ids] == [5] * len(prompt_ids)
    assert [len(lp) for lp in gen.logprobs] == [5] * len(prompt_ids)


def test_finish_reason_stop_includes_eos(policy: Policy, prompt_ids: list[list[int]]) -> None:
    ref = _sampled(policy, prompt_ids, NEVER)
    eos = _early_stop_token(ref.completion_ids)
    gen = _sampled(policy, prompt_ids, [eos])
    # Stopped rows keep their EOS and nothing after it; the others are unchanged.
    end = ref.completion_ids[0].index(eos) + 1
    assert gen.completion_ids[0] == ref.completion_ids[0][:end]
    assert gen.completion_ids[0][-1] == eos
    assert gen.logprobs[0] == pytest.approx(ref.logprobs[0][:end], abs=1e-6)
    assert gen.finish_reasons == ["stop"] + ["length"] * (len(prompt_ids) - 1)
    assert gen.completion_ids[1:] == ref.completion_ids[1:]


def test_eos_on_the_last_token_is_stop(policy: Policy, prompt_ids: list[list[int]]) -> None:
    ref = _sampled(policy, prompt_ids[:1], NEVER, n=4)
    last = ref.completion_ids[0][-1]
    if last in ref.completion_ids[0][:-1]:
        pytest.skip("the last sampled token also occurs earlier")
    gen = _sampled(policy, prompt_ids[:1], [last], n=4)
    assert gen.finish_reasons == ["stop"]
    assert gen.completion_ids == ref.completion_ids


# --------------------------------------------------------------------------- padding


def test_padding_does_not_change_other_rows(policy: Policy, prompt_ids: list[list[int]]) -> None:
    short = prompt_ids[2]
    long = prompt_ids[1] + prompt_ids[1]  # much longer: `short` gets many pad columns
    alone = _gen(policy, [short], greedy=True, eos_ids=NEVER)
    padded = _gen(policy, [long, short], greedy=True, eos_ids=NEVER)
    assert padded.completion_ids[1] == alone.completion_ids[0]
    _assert_close([padded.logprobs[1]], alone.logprobs, 1e-5)

    # The learner forward too: same tokens, batch of one vs next to a long row.
    completion = alone.completion_ids[0]
    lp_alone = _learner_logprobs(policy, [short], [completion], 0.7)
    lp_padded = _learner_logprobs(policy, [long, short], [padded.completion_ids[0], completion], 0.7)
    _assert_close([lp_padded[1]], lp_alone, 1e-5)


def test_right_padding_of_completions_does_not_change_logprobs(policy: Policy, prompt_ids) -> None:
    gen = _gen(policy, prompt_ids[:2], greedy=True, max_new_tokens=10, eos_ids=NEVER)
    shorter = [gen.completion_ids[0][:3], gen.completion_ids[1]]
    full = _learner_logprobs(policy, prompt_ids[:2], gen.completion_ids, 1.0)
    cut = _learner_logprobs(policy, prompt_ids[:2], shorter, 1.0)
    _assert_close([cut[0]], [full[0][:3]], 1e-5)
    _assert_close([cut[1]], [full[1]], 1e-5)


# --------------------------------------------------------------------------- batch layout


def test_build_batch_layout() -> None:
    sb = build_batch([[5, 6, 7], [8]], [[1], [2, 3]], pad_id=0)
    assert sb.prompt_len == 3
    assert sb.input_ids.tolist() == [[5, 6, 7, 1, 0], [0, 0, 8, 2, 3]]
    assert sb.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert sb.position_ids[1, 2:].tolist() == [0, 1, 2]
    assert sb.position_ids[0, :4].tolist() == [0, 1, 2, 3]
    assert sb.completion_ids.tolist() == [[1, 0], [2, 3]]
    assert sb.completion_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_pad_helpers() -> None:
    ids, mask = left_pad([[1, 2], [3]], pad_id=9)
    assert ids.tolist() == [[1, 2], [9, 3]] and mask.tolist() == [[1, 1], [0, 1]]
    assert positions(mask).tolist() == [[0, 1], [0, 0]]
    ids, mask = right_pad([[], []], pad_id=9)
    assert ids.shape == (2, 1) and mask.sum() == 0


def test_build_batch_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        build_batch([[1, 2], [3]], [[4]], pad_id=0)


def test_empty_prompt_raises(policy: Policy, prompt_ids: list[list[int]]) -> None:
    with pytest.raises(ValueError):
        _gen(policy, [prompt_ids[0], []], max_new_tokens=2)
    with pytest.raises(ValueError):
        _gen(policy, [], max_new_tokens=2)

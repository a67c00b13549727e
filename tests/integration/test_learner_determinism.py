"""A seeded learner step gives the same gradient bits when other processes load the cores.

A run of the demo on an idle machine is bit-reproducible; before this test existed, the same run
under load drifted from itself within a few steps: the learner's shared-prompt forward expanded
each prompt's keys and values with `keys[rows, ...]`, whose backward on a multi-threaded CPU adds
rows into their prompt with atomic float adds, in thread-timing order. Idle, the two threads kept
the same pace and the order held; under load it changed almost every step.

This drill runs the real thing: two busy-looping processes on the cores (`tests/cpu_load.py`),
the learner's forward and backward on two intra-op threads, repeated, and every repetition's
gradients compared bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import torch
from cpu_load import cores_loaded
from transformers import AutoModelForCausalLM, PreTrainedModel

from cascade.engine.batch import SequenceBatch, build_batch
from cascade.engine.logprobs import completion_logprobs

REPEATS = 12


def _grpo_like_batch(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """9 prompts x 8 completions (a GRPO step's shape), prompts of 30-45 tokens, completions of
    8-24: large enough that the prompt-expansion backward is split across threads."""
    g = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for _ in range(9):
        prompt_len = int(torch.randint(30, 46, (1,), generator=g))
        prompt = torch.randint(5, vocab, (prompt_len,), generator=g).tolist()
        for _ in range(8):
            length = int(torch.randint(8, 25, (1,), generator=g))
            prompts.append(prompt)
            completions.append(torch.randint(5, vocab, (length,), generator=g).tolist())
    return prompts, completions


def _gradients(model: PreTrainedModel, sb: SequenceBatch, signs: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logp = completion_logprobs(model, sb)
    ((logp.sum(-1) * signs).sum() / sb.completion_mask.sum()).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_learner_gradients_are_the_same_bits_under_cpu_load(
    random_tiny_model: Path, torch_two_threads: None
) -> None:
    model = AutoModelForCausalLM.from_pretrained(random_tiny_model).train()
    prompts, completions = _grpo_like_batch(model.config.vocab_size)
    sb = build_batch(prompts, completions, pad_id=0)
    signs = torch.tensor([1.0 if i % 3 else -1.0 for i in range(len(prompts))])  # advantages' role
    with cores_loaded():
        repeats = [_gradients(model, sb, signs) for _ in range(REPEATS)]
    names = [name for name, p in model.named_parameters() if p.grad is not None]
    for i, grads in enumerate(repeats[1:], start=1):
        differing = [n for n, a, b in zip(names, repeats[0], grads, strict=True) if not torch.equal(a, b)]
        assert not differing, f"repeat {i}: gradients differ from the first in {differing}"

"""A seeded learner step gives the same gradient bits when other processes load the cores.

A run of the demo on an idle machine is bit-reproducible; before this test existed, the same run
under load drifted from itself within a few steps: the learner's shared-prompt forward expanded
each prompt's keys and values with `keys[rows, ...]`, whose backward on a multi-threaded CPU adds
rows into their prompt with atomic float adds, in thread-timing order. Idle, the two threads kept
the same pace and the order held; under load it changed almost every step.

This drill runs the real thing: two busy-looping processes on the cores, the learner's forward
and backward on two intra-op threads, repeated, and every repetition's gradients compared bit
for bit.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logprobs

REPEATS = 12


@pytest.fixture
def loaded_cores() -> Iterator[None]:
    """Two processes spinning on the CPU for the test's duration (the machine has two cores)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


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


def test_learner_gradients_are_the_same_bits_under_cpu_load(
    random_tiny_model: Path, loaded_cores: None, torch_two_threads: None
) -> None:
    model = AutoModelForCausalLM.from_pretrained(random_tiny_model).train()
    prompts, completions = _grpo_like_batch(model.config.vocab_size)
    sb = build_batch(prompts, completions, pad_id=0)
    signs = torch.tensor([1.0 if i % 3 else -1.0 for i in range(len(prompts))])  # advantages' role
    first: list[torch.Tensor] | None = None
    for repeat in range(REPEATS):
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, sb)
        ((logp.sum(-1) * signs).sum() / sb.completion_mask.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        if first is None:
            first = grads
            continue
        differing = [
            name
            for (name, _), a, b in zip(model.named_parameters(), first, grads, strict=True)
            if not torch.equal(a, b)
        ]
        assert not differing, f"repeat {repeat}: gradients differ from the first in {differing}"

"""distill_term on real (random tiny) models: the three losses agree where they must."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cascade.config import DistillConfig
from cascade.distill.samples import DistillSamples
from cascade.runner.distill import distill_term


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.7])
def test_topk_over_the_whole_vocabulary_equals_full(random_tiny_model: Path, temperature: float) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    student = AutoModelForCausalLM.from_pretrained(random_tiny_model)
    teacher = AutoModelForCausalLM.from_pretrained(random_tiny_model)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    vocab = student.config.vocab_size
    samples = DistillSamples(
        teacher="math",
        prompt_ids=[[5, 6, 7], [8, 9]],
        completion_ids=[[10, 11, 12, 13], [14, 15]],
        rollout_logprobs=[[-1.0] * 4, [-1.0] * 2],
        temperature=1.0,
    )

    def loss(kind: str) -> float:
        cfg = DistillConfig(loss=kind, topk=vocab, temperature=temperature)  # type: ignore[arg-type]
        return float(distill_term(student, teacher, samples, cfg, pad_id=0).loss)

    full, topk = loss("full"), loss("topk")
    assert full > 0
    assert topk == pytest.approx(full, rel=1e-4)

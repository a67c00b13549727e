"""Per-token log-probs of completion tokens (the learner's forward)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from cascade.engine.batch import SequenceBatch


def completion_logits(model: PreTrainedModel, batch: SequenceBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits predicting each completion token: [B, C, V] float32 (whatever the model's dtype or
    autocast), divided by `temperature`; on the model's device."""
    batch = batch.to(model.device)
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    p = batch.prompt_len
    c = batch.completion_ids.shape[1]
    logits = out.logits[:, p - 1 : p - 1 + c, :].float()
    return logits / temperature


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token]: [B, C, V] x [B, C] -> [B, C]."""
    return torch.log_softmax(logits, dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def completion_logprobs(
    model: PreTrainedModel, batch: SequenceBatch, temperature: float = 1.0
) -> torch.Tensor:
    """[B, C] log-probs of the completion tokens at `temperature`; padding positions are 0."""
    batch = batch.to(model.device)
    logp = gather_logprobs(completion_logits(model, batch, temperature), batch.completion_ids)
    return logp * batch.completion_mask

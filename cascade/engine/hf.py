"""Batched sampling with a KV cache on a Hugging Face causal LM, keeping per-token log-probs.

Written by hand rather than with `model.generate` so that the log-probs it returns are the
ones the learner recomputes (same temperature scaling, same position ids, full-vocabulary
softmax before top-p truncation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from cascade.engine.batch import left_pad, positions


@dataclass
class Generation:
    completion_ids: list[list[int]]  # without padding, EOS included when produced
    logprobs: list[list[float]]  # one per completion token, at the sampling temperature
    finish_reasons: list[str]  # "stop" (EOS) or "length" (token budget)


def _sample(logits: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        sorted_p = sorted_p.masked_fill(cum - sorted_p > top_p, 0.0)
        choice = torch.multinomial(sorted_p, 1, generator=generator)
        return order.gather(-1, choice).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Generation:
    """Sample on the model's device (CPU or GPU); `generator` must live on that device."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    was_training = model.training
    model.eval()
    device = model.device
    ids, attn = left_pad(prompts, pad_id)
    ids, attn = ids.to(device), attn.to(device)
    pos = positions(attn)
    batch = ids.shape[0]
    cache = DynamicCache()
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=True)
    logits = out.logits[:, -1, :].float()
    next_pos = pos[:, -1] + 1
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    logps: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        tok = logits.argmax(-1) if greedy else _sample(logits / temperature, top_p, generator)
        lp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        logps.append(torch.where(done, torch.zeros_like(lp), lp))
        hit_eos = torch.isin(tok, eos) & ~done
        stopped |= hit_eos
        done |= hit_eos
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((batch, 1), dtype=attn.dtype, device=device)], dim=1)
        out = model(
            input_ids=tok.unsqueeze(-1),
            attention_mask=attn,
            position_ids=next_pos.unsqueeze(-1),
            cache=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1, :].float()
        next_pos = next_pos + 1
    model.train(was_training)
    tok_mat = torch.stack(tokens, dim=1).cpu()
    lp_mat = torch.stack(logps, dim=1).cpu()
    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    reasons: list[str] = []
    eos_set = set(eos_ids)
    for i in range(batch):
        row = tok_mat[i].tolist()
        end = len(row)
        for j, t in enumerate(row):
            if t in eos_set:
                end = j + 1
                break
        completions.append(row[:end])
        logprobs.append(lp_mat[i, :end].tolist())
        reasons.append("stop" if bool(stopped[i]) else "length")
    return Generation(completion_ids=completions, logprobs=logprobs, finish_reasons=reasons)

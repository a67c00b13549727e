"""The token sampler of the Hugging Face decode loop, correct on any device.

A sampled token costs one uniform draw per row (inverse CDF over the row's probabilities).
The draws come from the generator where it lives and are then moved to the logits' device,
so a CPU generator serves a CUDA model and the reverse. Seeded requests use a CPU generator
(`request_generator`) on every device: the same seed then gives the same draws in the
embedded run and on a rollout service, on a CPU or a GPU, and on the CPU the tokens are
bitwise those the decode loop always sampled.
"""

from __future__ import annotations

import torch


def request_generator(seed: int) -> torch.Generator:
    """The generator of a request that carries a seed (whatever device the model is on)."""
    return torch.Generator().manual_seed(seed)


def draw_uniform(n: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """`n` draws in [0, 1) on `device`, from `generator` on its own device (the default
    generator of `device` if None)."""
    if generator is None:
        return torch.rand(n, device=device)
    return torch.rand(n, generator=generator, device=generator.device).to(device)


def inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One index per row of `weights` [B, V] (>= 0, every row some positive), drawn with
    probability proportional to its weight: the first index whose cumulative weight exceeds
    `uniform` [B] (draws in [0, 1)) times the row's total. Zero weights are never drawn."""
    cdf = weights.cumsum(-1)  # [B, V]
    total = cdf[:, -1:]
    u = uniform.to(cdf.device, cdf.dtype).unsqueeze(-1) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u < total, even rounded
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


def next_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    uniform: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B] and their log-probs [B] from float logits [B, V], on the logits' device.

    The log-probs are log_softmax(logits / temperature) over the full vocabulary (what the
    learner recomputes), whatever `top_p`. `uniform` [B]: one draw per row, the token sampled
    within the top-p nucleus; None: greedy (argmax)."""
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if uniform is None:
        tok = logits.argmax(-1)
    elif top_p < 1.0:
        sorted_p, order = logp.exp().sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        sorted_p = sorted_p.masked_fill(cum - sorted_p > top_p, 0.0)
        tok = order.gather(-1, inverse_cdf(sorted_p, uniform).unsqueeze(-1)).squeeze(-1)
    else:
        tok = inverse_cdf(logp.exp(), uniform)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)

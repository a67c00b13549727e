"""Multi-turn completions: which tokens are the model's, and the loss mask that follows.

A multi-turn completion is one token sequence after the prompt: the model's turns with the
environment's text between them (the turn's end, the tool responses, the next turn's opening).
The whole sequence is the context of every later token, but only the model's own tokens are
trained: the GRPO loss, the log-probs it compares, the importance ratio, the staleness clip and
the distillation terms (a teacher scores only the student's tokens) all count the positions of
`model_token_mask` and nothing else. The existing losses already take a `[B, T]` mask and
replace every masked position before any arithmetic (`cascade.algo.masking`), so this module
only has to say which positions those are, and where per-model-token values (the engine's
log-probs, which exist only for tokens it sampled) go in the `[B, T]` layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TurnLayout:
    """One completion as runs of tokens: `(n_tokens, is_model)` in order."""

    runs: tuple[tuple[int, bool], ...]

    def __post_init__(self) -> None:
        for n, _ in self.runs:
            if n < 0:
                raise ValueError(f"a run of {n} tokens")

    @classmethod
    def of_pieces(cls, pieces: Sequence[tuple[Sequence[int], bool]]) -> tuple[TurnLayout, list[int]]:
        """The layout of token pieces (model turns and environment texts, already token ids:
        never re-tokenised together, which would move the boundaries), and their concatenation."""
        ids = [t for piece, _ in pieces for t in piece]
        return cls(tuple((len(piece), is_model) for piece, is_model in pieces)), ids

    @property
    def length(self) -> int:
        return sum(n for n, _ in self.runs)

    @property
    def n_model(self) -> int:
        return sum(n for n, is_model in self.runs if is_model)

    def model_mask(self) -> list[bool]:
        return [is_model for n, is_model in self.runs for _ in range(n)]

    def scatter(self, model_values: Sequence[float], fill: float = 0.0) -> list[float]:
        """Per-model-token values (in order) placed at the model's positions, `fill` elsewhere."""
        if len(model_values) != self.n_model:
            raise ValueError(f"{len(model_values)} values for {self.n_model} model tokens")
        values = iter(model_values)
        return [next(values) if is_model else fill for is_model in self.model_mask()]


def model_token_mask(layouts: Sequence[TurnLayout], completion_mask: Tensor) -> Tensor:
    """`[B, C]` bool: the completion's real tokens (`completion_mask`, right-padded) that the
    model generated. A layout must cover its row's real tokens exactly."""
    b, c = completion_mask.shape
    if len(layouts) != b:
        raise ValueError(f"{len(layouts)} layouts for {b} rows")
    out = torch.zeros((b, c), dtype=torch.bool, device=completion_mask.device)
    for row, layout in enumerate(layouts):
        real = int((completion_mask[row] != 0).sum())
        if layout.length != real:
            raise ValueError(f"row {row}: layout covers {layout.length} tokens, the row has {real}")
        out[row, :real] = torch.tensor(layout.model_mask(), dtype=torch.bool, device=completion_mask.device)
    return out & (completion_mask != 0)


def scatter_model_values(
    layouts: Sequence[TurnLayout], values: Sequence[Sequence[float]], width: int, fill: float = 0.0
) -> Tensor:
    """`[B, width]` float: each row's per-model-token values at its model positions (e.g. the
    engine's sampling log-probs as `old_logprobs`), `fill` at environment and padding positions."""
    out = torch.full((len(layouts), width), fill, dtype=torch.float32)
    for row, (layout, row_values) in enumerate(zip(layouts, values, strict=True)):
        if layout.length > width:
            raise ValueError(f"row {row}: {layout.length} tokens over width {width}")
        out[row, : layout.length] = torch.tensor(layout.scatter(row_values, fill), dtype=torch.float32)
    return out

"""One batch layout shared by generation and training, so log-probs agree.

Prompts are left-padded to a common length P and completions right-padded to C, so every
row's completion starts at column P. Position ids are `cumsum(attention_mask) - 1`: the same
formula during generation (with a KV cache) and in the training forward, which is what keeps
the rollout engine's log-probs equal to the learner's for the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor  # [B, P + C] long
    attention_mask: torch.Tensor  # [B, P + C] long
    position_ids: torch.Tensor  # [B, P + C] long
    completion_ids: torch.Tensor  # [B, C] long (pad where absent)
    completion_mask: torch.Tensor  # [B, C] float, 1 on real completion tokens
    prompt_len: int  # P

    def to(self, device: torch.device | str) -> SequenceBatch:
        """The batch on `device` (the same tensors when they are there already)."""
        return SequenceBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            completion_ids=self.completion_ids.to(device),
            completion_mask=self.completion_mask.to(device),
            prompt_len=self.prompt_len,
        )

    def rows(self, lo: int, hi: int) -> SequenceBatch:
        """Rows `lo:hi` on the same layout (same P and C: each row's numbers are unchanged)."""
        return SequenceBatch(
            input_ids=self.input_ids[lo:hi],
            attention_mask=self.attention_mask[lo:hi],
            position_ids=self.position_ids[lo:hi],
            completion_ids=self.completion_ids[lo:hi],
            completion_mask=self.completion_mask[lo:hi],
            prompt_len=self.prompt_len,
        )


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
    return ids, mask


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def build_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> SequenceBatch:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    p_ids, p_mask = left_pad(prompts, pad_id)
    c_ids, c_mask = right_pad(completions, pad_id)
    input_ids = torch.cat([p_ids, c_ids], dim=1)
    attention_mask = torch.cat([p_mask, c_mask], dim=1)
    return SequenceBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions(attention_mask),
        completion_ids=c_ids,
        completion_mask=c_mask.float(),
        prompt_len=p_ids.shape[1],
    )

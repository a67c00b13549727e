"""Reading a sequence-classification reward model: the text it reads and its rewards.

`format_rm_input` renders a (prompt, response) exchange as the reward model reads it (the
"rlhf" domain's scorer and the tiny reward model's build both use it); `rewards_of` forwards
rendered texts in buckets of similar length and returns one scalar reward per text. The tiny
reward model itself is built in `bootstrap/reward_model.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase, Qwen3ForSequenceClassification

__all__ = ["format_rm_input", "rewards_of"]


def format_rm_input(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> str:
    """The text the reward model reads: the chat-rendered (prompt, response) exchange."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        if isinstance(text, str):
            return text
    return f"{prompt}\n{response}"


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
    enc = tokenizer(
        texts,
        add_special_tokens=False,
        padding=True,
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def rewards_of(
    model: Qwen3ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int = 256,
    bucket_size: int = 16,
) -> torch.Tensor:
    """Rewards of rendered texts, in order; forwarded in buckets of similar length.

    Sorting by length before batching spares most of the padding a mixed batch pays (a
    rambling reply is three times a polite one), and right padding leaves the rewards as they
    are; autograd flows through when the caller wants it (training).
    """
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    parts = []
    for start in range(0, len(order), bucket_size):
        chunk = [texts[i] for i in order[start : start + bucket_size]]
        parts.append(model(**_encode(tokenizer, chunk, max_length)).logits[:, 0])
    if not parts:
        return torch.zeros(0)
    sorted_rewards = torch.cat(parts)
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return sorted_rewards.index_select(0, inverse)

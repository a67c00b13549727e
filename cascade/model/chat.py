"""Render a user prompt through the checkpoint's chat template with the thinking flag."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from cascade.config import ChatConfig


def render_prompt(tokenizer: PreTrainedTokenizerBase, chat: ChatConfig, prompt: str, thinking: bool) -> str:
    flag = chat.think_flag if thinking else chat.no_think_flag
    messages = []
    if chat.system_prompt:
        messages.append({"role": "system", "content": chat.system_prompt})
    messages.append({"role": "user", "content": f"{prompt} {flag}".strip()})
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=thinking, tokenize=False
    )
    assert isinstance(text, str)
    return text


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, chat: ChatConfig, prompts: list[str], thinking: bool
) -> list[list[int]]:
    texts = [render_prompt(tokenizer, chat, p, thinking) for p in prompts]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]

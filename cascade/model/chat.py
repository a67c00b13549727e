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


def render_messages(
    tokenizer: PreTrainedTokenizerBase, chat: ChatConfig, messages: list[dict[str, str]], thinking: bool
) -> str:
    """A whole conversation (e.g. from the rollout service's chat prompts): the thinking flag is
    appended to the last user message, as `render_prompt` does for a single prompt, and the
    config's system prompt is added when the conversation has none."""
    msgs = [dict(m) for m in messages]
    last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
    if last_user is not None:
        flag = chat.think_flag if thinking else chat.no_think_flag
        msgs[last_user]["content"] = f"{msgs[last_user]['content']} {flag}".strip()
    if chat.system_prompt and not any(m.get("role") == "system" for m in msgs):
        msgs.insert(0, {"role": "system", "content": chat.system_prompt})
    text = tokenizer.apply_chat_template(
        msgs, add_generation_prompt=True, enable_thinking=thinking, tokenize=False
    )
    assert isinstance(text, str)
    return text


def encode_messages(
    tokenizer: PreTrainedTokenizerBase, chat: ChatConfig, messages: list[dict[str, str]], thinking: bool
) -> list[int]:
    text = render_messages(tokenizer, chat, messages, thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

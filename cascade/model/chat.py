"""Render a user prompt through the checkpoint's chat template with the thinking flag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from cascade.config import ChatConfig


class NoChatTemplate(ValueError):
    """Neither the config (`chat.template_path`, `chat.template`) nor the tokenizer gives a
    chat template (`cascade validate` says so before a run)."""


def chat_template(tokenizer: PreTrainedTokenizerBase, chat: ChatConfig) -> str | None:
    """The template prompts are rendered with: the config's, else None (the tokenizer's own).
    `NoChatTemplate` when there is neither."""
    text = chat.template_text()
    if text is None and not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate(
            f"{getattr(tokenizer, 'name_or_path', 'the tokenizer')}: no chat template: give one with "
            "chat.template_path (a Jinja file) or chat.template"
        )
    return text


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatConfig,
    prompt: str,
    thinking: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """`tools`: function schemas the template renders (an agent problem's tools)."""
    flag = chat.think_flag if thinking else chat.no_think_flag
    messages = []
    if chat.system_prompt:
        messages.append({"role": "system", "content": chat.system_prompt})
    messages.append({"role": "user", "content": f"{prompt} {flag}".strip()})
    schemas: list[dict[Any, Any] | Callable[..., Any]] | None = list(tools) if tools else None
    text = tokenizer.apply_chat_template(
        messages,
        tools=schemas,
        chat_template=chat_template(tokenizer, chat),
        add_generation_prompt=True,
        enable_thinking=thinking,
        tokenize=False,
    )
    assert isinstance(text, str)
    return text


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatConfig,
    prompts: list[str],
    thinking: bool,
    tools: list[list[dict[str, Any]] | None] | None = None,
) -> list[list[int]]:
    """`tools`: per prompt, the function schemas its template renders (None: none)."""
    per_prompt = tools if tools is not None else [None] * len(prompts)
    texts = [render_prompt(tokenizer, chat, p, thinking, t) for p, t in zip(prompts, per_prompt, strict=True)]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def token_encoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[str, bool], list[int]]:
    """`(text, literal) -> ids` for the turn loop: literal text (a tool's output) is split as
    plain characters, so special-token text in it never becomes the special token."""

    def encode(text: str, literal: bool) -> list[int]:
        if not text:
            return []
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=literal)["input_ids"])

    return encode


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
        msgs,
        chat_template=chat_template(tokenizer, chat),
        add_generation_prompt=True,
        enable_thinking=thinking,
        tokenize=False,
    )
    assert isinstance(text, str)
    return text


def encode_messages(
    tokenizer: PreTrainedTokenizerBase, chat: ChatConfig, messages: list[dict[str, str]], thinking: bool
) -> list[int]:
    text = render_messages(tokenizer, chat, messages, thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def completion_decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[list[int]]], list[str]]:
    """Completions as text without special tokens, except the reasoning markers.

    A tokenizer may make `<think>`/`</think>` special tokens (the tiny model's does):
    `skip_special_tokens=True` would drop them, and the verifier could no longer tell the
    reasoning from the answer (an answer written only in the reasoning would be paid, a right
    answer after reasoning judged with the reasoning in front of it). Every path that turns
    sampled ids into the text a verifier reads (the rollouts, the eval, the distillation fetch,
    the rollout workers) decodes with this."""
    markers = {tokenizer.convert_tokens_to_ids(t) for t in (THINK_OPEN, THINK_CLOSE)}
    markers.discard(tokenizer.unk_token_id)
    special = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
    dropped = (special | set(tokenizer.all_special_ids)) - markers

    def decode(ids: list[list[int]]) -> list[str]:
        kept = [[t for t in seq if t not in dropped] for seq in ids]
        return tokenizer.batch_decode(kept, skip_special_tokens=False)

    return decode


def strip_thinking(completion: str) -> str:
    """The final response: what follows the last `</think>`, up to any `<think>` left open.

    Everything before the last `</think>` is reasoning, whether its `<think>` is in the
    completion (Qwen3-style templates, where the model writes it) or in the prompt (templates
    that open the block in the generation prompt, so the completion starts inside it). An
    answer written only in the reasoning never counts, and a block left open drops the rest.
    """
    close = completion.rfind(THINK_CLOSE)
    text = completion[close + len(THINK_CLOSE) :] if close >= 0 else completion
    start = text.find(THINK_OPEN)
    if start >= 0:
        text = text[:start]
    return text.strip()

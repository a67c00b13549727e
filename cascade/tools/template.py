"""Tool calls and tool responses in the text format of a model's chat template.

Nothing here names a marker: `derive_tool_format` renders a few sentinel conversations (a tool
call, one and two tool responses, a plain answer) through the template and reads off where
the sentinels land. For a Qwen3-style template that gives `<tool_call>\\n{"name": ..,
"arguments": ..}\\n</tool_call>` for a call and `<|im_start|>user\\n<tool_response>\\n..\\n
</tool_response><|im_end|>\\n` around the responses; another template gives its own markers.

`TOOL_CHAT_TEMPLATE` is the tiny model's template made tool-aware in Qwen3's convention (a
conversation without tools or tool turns renders exactly as the plain template did).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

Message = dict[str, Any]
Tools = list[dict[Any, Any] | Callable[..., Any]]
Renderer = Callable[[list[Message], Tools | None, bool], str]
"""(messages, tools, add_generation_prompt) -> the template's text."""

TOOL_CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' -%}{{ messages[0]['content'] + '\n\n' }}{%- endif -%}"
    "{{ 'Tools:' }}"
    "{%- for tool in tools -%}"
    "{{ ' ' + (tool['function']['name'] if tool['function'] is defined else tool['name']) }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] == 'system' and tools -%}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined"
    " and message['tool_calls'] -%}"
    "{{ '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{%- if message['content'] or not loop.first -%}{{ '\n' }}{%- endif -%}"
    "{{ '<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{ f['arguments'] if f['arguments'] is string else f['arguments'] | tojson }}"
    "{{ '}\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{ '<|im_start|>user' }}"
    "{%- endif -%}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\n\n</think>\n\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


class TemplateWithoutTools(ValueError):
    """The chat template does not render tool calls or tool responses."""


@dataclass(frozen=True)
class ToolCallText:
    """One call as the model wrote it: the decoded JSON's name and arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolFormat:
    """Where a template puts tool calls and responses (all fields are the template's text)."""

    call_prefix: str
    """Before a call's JSON (`<tool_call>\\n`)."""
    call_suffix: str
    """After it (`\\n</tool_call>`)."""
    call_separator: str
    """Between two calls of one turn."""
    name_key: str
    arguments_key: str
    turn_end: str
    """What ends an assistant turn (`<|im_end|>\\n`)."""
    responses_prefix: str
    """From the end of the assistant turn to the first response's content."""
    response_separator: str
    responses_suffix: str
    """After the last response's content, to the end of the tool turn."""
    generation_prompts: tuple[str, str]
    """The next assistant turn's opening: (with thinking, without thinking)."""

    @property
    def call_open(self) -> str:
        return self.call_prefix.strip()

    @property
    def call_close(self) -> str:
        return self.call_suffix.strip()

    def render_calls(self, calls: Sequence[ToolCallText]) -> str:
        """Calls as the template writes them in an assistant turn (`json.dumps` = Jinja's tojson)."""
        bodies = [
            json.dumps({self.name_key: c.name, self.arguments_key: c.arguments}, ensure_ascii=False)
            for c in calls
        ]
        return self.call_separator.join(f"{self.call_prefix}{b}{self.call_suffix}" for b in bodies)

    def env_text(self, responses: Sequence[str], thinking: bool = False) -> str:
        """What follows a turn with calls: the turn's end, the tool turn, the next turn's opening."""
        block = self.responses_prefix + self.response_separator.join(responses) + self.responses_suffix
        return self.turn_end + block + self.generation_prompts[0 if thinking else 1]


def tokenizer_renderer(tokenizer: PreTrainedTokenizerBase, thinking: bool = False) -> Renderer:
    def render(messages: list[Message], tools: Tools | None, gen: bool) -> str:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=gen, enable_thinking=thinking, tokenize=False
        )
        assert isinstance(text, str)
        return text

    return render


def template_renderer(chat_template: str, thinking: bool = False) -> Renderer:
    """A Jinja chat template rendered as `apply_chat_template` renders it, without a tokenizer."""

    def render(messages: list[Message], tools: Tools | None, gen: bool) -> str:
        return render_jinja_template(
            [messages],
            tools=tools,
            chat_template=chat_template,
            add_generation_prompt=gen,
            enable_thinking=thinking,
        )[0][0]

    return render


def format_of_template(chat_template: str = TOOL_CHAT_TEMPLATE) -> ToolFormat:
    return derive_tool_format(template_renderer(chat_template, True), template_renderer(chat_template, False))


def format_of_tokenizer(tokenizer: PreTrainedTokenizerBase) -> ToolFormat:
    return derive_tool_format(tokenizer_renderer(tokenizer, True), tokenizer_renderer(tokenizer, False))


_USER = {"role": "user", "content": "Qsentinel"}
_NAME, _KEY, _VALUE = "fnsentinel", "argsentinel", "valsentinel"
_R1, _R2, _ANSWER = "Rsentinelone", "Rsentineltwo", "Asentinel"
_TOOLS: Tools = [
    {
        "type": "function",
        "function": {
            "name": _NAME,
            "description": "sentinel",
            "parameters": {"type": "object", "properties": {_KEY: {"type": "string"}}, "required": [_KEY]},
        },
    }
]


def _calls_message(n: int) -> Message:
    call = {"type": "function", "function": {"name": _NAME, "arguments": {_KEY: _VALUE}}}
    return {"role": "assistant", "content": "", "tool_calls": [call] * n}


def derive_tool_format(render_thinking: Renderer, render_plain: Renderer) -> ToolFormat:
    """The tool format of a template, given it rendered with thinking on and off."""
    render = render_plain
    one_call = render([_USER, _calls_message(1)], _TOOLS, False)
    start, end, decoded = _call_json(one_call)
    name_key = next(k for k, v in decoded.items() if v == _NAME)
    arguments_key = next(k for k, v in decoded.items() if v == {_KEY: _VALUE})
    answered = render([_USER, {"role": "assistant", "content": _ANSWER}], _TOOLS, False)
    answer_at = answered.rindex(_ANSWER)
    turn_end = _after_close(answered, answer_at + len(_ANSWER))
    before, after = one_call[:start], one_call[end:]
    call_prefix = before[len(os.path.commonprefix([before, answered[:answer_at]])) :]
    if not call_prefix.strip() or not after.endswith(turn_end) or not after[: -len(turn_end)].strip():
        raise TemplateWithoutTools("no marker around the rendered tool call")
    call_suffix = after[: -len(turn_end)]

    two_calls = render([_USER, _calls_message(2)], _TOOLS, False)
    first_end = two_calls.index(call_suffix, start) + len(call_suffix)
    second_start = two_calls.index(call_prefix, first_end)
    call_separator = two_calls[first_end:second_start]

    conversation = [_USER, _calls_message(1)]
    one = render([*conversation, {"role": "tool", "content": _R1}], _TOOLS, False)
    two = render(
        [*conversation, {"role": "tool", "content": _R1}, {"role": "tool", "content": _R2}], _TOOLS, False
    )
    block_start = _block_start(one, call_suffix, turn_end, _R1)
    if block_start != _block_start(two, call_suffix, turn_end, _R1):
        raise TemplateWithoutTools("one and two tool responses render different openings")
    responses_prefix = one[block_start : one.index(_R1, block_start)]
    responses_suffix = one[one.index(_R1, block_start) + len(_R1) :]
    if not two.endswith(responses_suffix):
        raise TemplateWithoutTools("one and two tool responses render different endings")
    response_separator = two[two.index(_R1, block_start) + len(_R1) : two.index(_R2, block_start)]
    return ToolFormat(
        call_prefix=call_prefix,
        call_suffix=call_suffix,
        call_separator=call_separator,
        name_key=name_key,
        arguments_key=arguments_key,
        turn_end=turn_end,
        responses_prefix=responses_prefix,
        response_separator=response_separator,
        responses_suffix=responses_suffix,
        generation_prompts=(_generation_prompt(render_thinking), _generation_prompt(render_plain)),
    )


def _call_json(text: str) -> tuple[int, int, dict[str, Any]]:
    """Span and value of the JSON object holding the sentinel call."""
    at = text.find(f'"{_NAME}"')
    if at < 0:
        raise TemplateWithoutTools("the template does not render an assistant message's tool_calls")
    decoder = json.JSONDecoder()
    for start in range(at, -1, -1):
        if text[start] != "{":
            continue
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict) and _NAME in value.values():
            return start, end, value
    raise TemplateWithoutTools("the rendered tool call is not a JSON object with the function's name")


def _after_close(text: str, at: int) -> str:
    rest = text[at:]
    if not rest.strip():
        raise TemplateWithoutTools("nothing ends an assistant turn")
    return rest


def _block_start(text: str, call_suffix: str, turn_end: str, first: str) -> int:
    """Where the tool turn starts: after the call's closing marker and the turn's end."""
    at = text.rindex(call_suffix, 0, text.index(first)) + len(call_suffix)
    if not text.startswith(turn_end, at):
        raise TemplateWithoutTools("a turn with tool calls does not end as a plain turn does")
    return at + len(turn_end)


def _generation_prompt(render: Renderer) -> str:
    with_prompt = render([_USER], None, True)
    without = render([_USER], None, False)
    if not with_prompt.startswith(without):
        raise TemplateWithoutTools("the generation prompt is not appended to the conversation")
    return with_prompt[len(without) :]

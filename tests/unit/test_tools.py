"""Tool calls in the template's format, the calculator, the tools, and the environment's
answers to every malformed call (an error response and a count, never an exception)."""

from __future__ import annotations

import json

import pytest

from cascade.bootstrap.tokenizer import CHAT_TEMPLATE
from cascade.tools.calculator import CalcError, calculate
from cascade.tools.environment import (
    BAD_ARGUMENTS,
    BAD_JSON,
    ERROR_PREFIX,
    OVERSIZED,
    TOO_MANY_EPISODE,
    TOO_MANY_TURN,
    UNKNOWN_TOOL,
    ToolEnvironment,
    ToolLimits,
)
from cascade.tools.template import (
    TOOL_CHAT_TEMPLATE,
    TemplateWithoutTools,
    ToolCallText,
    format_of_template,
    template_renderer,
)

FMT = format_of_template(TOOL_CHAT_TEMPLATE)

# Another template in the same family but other markers and whitespace: a `tool` role turn per
# response block, `<call>`/`</call>` around `{"function": .., "args": ..}`, `<end>` turn ends.
OTHER_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{ '[tool]' }}{%- endif -%}"
    "{{ ' <out>' + message['content'] + '</out>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{ '<end>' }}{%- endif -%}"
    "{%- else -%}"
    "{{ '[' + message['role'] + '] ' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{{ '<call>' + {'function': call['function']['name'], 'args': call['function']['arguments']} | tojson }}"
    "{{ '</call>' }}"
    "{%- endfor -%}"
    "{{ '<end>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '[assistant] ' }}{%- endif -%}"
)


# Qwen3's history behaviour, written here in short: the assistant turn after the last user
# message opens with an (empty) think block, earlier ones do not; text before calls is joined
# to them with a newline.
THINKING_HISTORY_TEMPLATE = (
    "{%- set last_user = namespace(i=-1) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{%- set last_user.i = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if loop.index0 > last_user.i and loop.last -%}{{ '<think>\n\n</think>\n\n' }}{%- endif -%}"
    "{{ m['content'] or '' }}"
    "{%- for c in m['tool_calls'] or [] -%}"
    "{%- if m['content'] or not loop.first -%}{{ '\n' }}{%- endif -%}"
    "{{ '<tool_call>\n' }}"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}"
    "{{ '\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if messages[loop.index0 - 1]['role'] != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\n<tool_response>\n' + m['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{ '<|im_end|>\n' }}{%- endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\n\n</think>\n\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def test_format_survives_a_think_block_only_in_the_last_turn() -> None:
    assert format_of_template(THINKING_HISTORY_TEMPLATE) == FMT


def test_format_derived_from_the_tiny_template_is_qwen3s() -> None:
    assert (FMT.call_open, FMT.call_close) == ("<tool_call>", "</tool_call>")
    assert (FMT.name_key, FMT.arguments_key) == ("name", "arguments")
    assert FMT.turn_end == "<|im_end|>\n"
    assert FMT.responses_prefix == "<|im_start|>user\n<tool_response>\n"
    assert FMT.responses_suffix == "\n</tool_response><|im_end|>\n"
    assert FMT.generation_prompts == (
        "<|im_start|>assistant\n",
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    )


def test_rendered_calls_and_responses_are_the_templates_own_text() -> None:
    """The format reproduces what apply_chat_template renders for the same conversation (with
    thinking on: without it, the generation prompt's empty think block is not in the history's
    rendering of the turn, which is why the turn loop appends instead of re-rendering)."""
    render = template_renderer(TOOL_CHAT_TEMPLATE, thinking=True)
    calls = [ToolCallText("kv_get", {"key": "fig"}), ToolCallText("calc", {"expression": "2+3"})]
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls],
        },
        {"role": "tool", "content": "4"},
        {"role": "tool", "content": "5"},
    ]
    prompt = render(messages[:1], None, True)
    whole = render(messages, None, True)
    assert whole == prompt + FMT.render_calls(calls) + FMT.env_text(["4", "5"], thinking=True)
    history = render(messages[:2], None, False)
    assert history.endswith(FMT.render_calls(calls) + FMT.turn_end)
    no_think = template_renderer(TOOL_CHAT_TEMPLATE, thinking=False)(messages, None, True)
    assert no_think == history + FMT.env_text(["4", "5"], thinking=False)[len(FMT.turn_end) :]


def test_format_follows_another_template() -> None:
    fmt = format_of_template(OTHER_TEMPLATE)
    assert (fmt.call_open, fmt.call_close, fmt.name_key, fmt.arguments_key) == (
        "<call>",
        "</call>",
        "function",
        "args",
    )
    assert fmt.turn_end == "<end>"
    assert fmt.env_text(["1", "2"]) == "<end>[tool] <out>1</out> <out>2</out><end>[assistant] "
    env = ToolEnvironment(fmt, {"a": 1})
    step = env.step('<call>{"function": "kv_get", "args": {"key": "a"}}</call>')
    assert step.responses == ["1"]


def test_plain_template_has_no_tool_format_and_tool_template_keeps_plain_chats() -> None:
    with pytest.raises(TemplateWithoutTools):
        format_of_template(CHAT_TEMPLATE)
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for thinking in (True, False):
        plain, tools = (
            template_renderer(CHAT_TEMPLATE, thinking),
            template_renderer(TOOL_CHAT_TEMPLATE, thinking),
        )
        assert plain(chat, None, True) == tools(chat, None, True)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("7/2", "7/2"),
        ("1/3+1/6", "1/2"),
        ("7//2", "3"),
        ("-7 % 3", "2"),
        ("2^10", "1024"),
        ("2**-2", "1/4"),
        ("1.5*2", "3"),
        ("-(-3)", "3"),
        ("0.1+0.2", "3/10"),
    ],
)
def test_calculator_is_exact(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("1/0", "division by zero"),
        ("0^-1", "division by zero"),
        ("2^1000", "exponent larger"),
        ("10^60^2", "exponent larger"),
        ("99999999999^40", "too large"),
        ("2^(1/2)", "must be an integer"),
        ("__import__('os')", "unexpected character"),
        ("1+", "ends too early"),
        ("(1 2", "expected '\\)'"),
        ("(1", "ends too early"),
        ("1 2", "unexpected"),
        ("(" * 40 + "1" + ")" * 40, "nested deeper"),
        ("-" * 40 + "1", "nested deeper"),
        ("1+" * 150 + "1", "longer than"),
        ("", "empty"),
    ],
)
def test_calculator_refuses(expression: str, why: str) -> None:
    with pytest.raises(CalcError, match=why):
        calculate(expression)


def _call(name: str, **arguments: object) -> str:
    return FMT.render_calls([ToolCallText(name, dict(arguments))])


def test_store_tools_and_calc() -> None:
    env = ToolEnvironment(FMT, {"fig": 3, "plum": 4})
    step = env.step(_call("kv_get", key="fig") + FMT.call_separator + _call("kv_get", key="plum"))
    assert step.responses == ["3", "4"] and not step.final
    assert env.step(_call("calc", expression="3*4")).responses == ["12"]
    assert env.step(_call("kv_set", key="total", value=12)).responses == ["ok"]
    assert env.step(_call("kv_list")).responses == ["fig plum total"]
    assert env.store.values == {"fig": 3, "plum": 4, "total": 12}
    final = env.step("12")
    assert final.final and final.outcomes == ()
    assert env.stats.as_metrics()["calls"] == 5 and env.stats.ok == 5 and env.stats.turns == 5


def test_tool_errors_are_responses() -> None:
    env = ToolEnvironment(FMT, {"fig": 3})
    responses = env.step(
        _call("kv_get", key="nope") + _call("calc", expression="1/0") + _call("kv_set", key="a b", value=1)
    ).responses
    assert responses == ["error: no key 'nope'", "error: division by zero", responses[2]]
    assert responses[2].startswith("error: a key is")
    assert env.stats.tool_errors == 3 and env.stats.ok == 0 and not env.stats.malformed


def test_calls_in_the_reasoning_block_are_not_calls() -> None:
    env = ToolEnvironment(FMT, {"fig": 3})
    assert env.step(f"<think>{_call('kv_get', key='fig')}</think>\n\n7").final


@pytest.mark.parametrize(
    ("turn", "kind"),
    [
        ("<tool_call>\n{not json}\n</tool_call>", BAD_JSON),
        ("<tool_call>\n[1, 2]\n</tool_call>", BAD_JSON),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', BAD_JSON),
        ('<tool_call>\n{"name": "kv_get", "arguments": "key=fig"}\n</tool_call>', BAD_JSON),
        ('<tool_call>\n{"name": "kv_get", "arguments": {"key": "fig"}, "x": 1}\n</tool_call>', BAD_JSON),
        ('<tool_call>\n{"name": "kv_get", "arguments": {"key": "fig"}}', BAD_JSON),  # never closed
        ("<tool_call>\n" + "[" * 100_000 + "\n</tool_call>", OVERSIZED),
        (_call("rm_rf", path="/"), UNKNOWN_TOOL),
        (_call("kv_get", key=3), BAD_ARGUMENTS),
        (_call("kv_get"), BAD_ARGUMENTS),
        (_call("kv_get", key="fig", extra=1), BAD_ARGUMENTS),
        (_call("kv_set", key="fig", value="4"), BAD_ARGUMENTS),
        (_call("kv_set", key="fig", value=4.0), BAD_ARGUMENTS),
        (_call("kv_set", key="fig", value=True), BAD_ARGUMENTS),
        (_call("calc", expression=["1", "+", "2"]), BAD_ARGUMENTS),
        (
            "<tool_call>\n"
            + json.dumps({"name": "calc", "arguments": {"expression": "1" * 600}})
            + "\n</tool_call>",
            OVERSIZED,
        ),
    ],
)
def test_malformed_calls_get_an_error_and_are_counted(turn: str, kind: str) -> None:
    env = ToolEnvironment(FMT, {"fig": 3})
    step = env.step(turn)
    assert len(step.outcomes) == 1
    outcome = step.outcomes[0]
    assert outcome.error == kind and outcome.response.startswith(f"{ERROR_PREFIX}{kind}: ")
    assert len(outcome.response) <= ToolLimits().max_response_chars
    assert env.stats.malformed == {kind: 1} and env.stats.calls == 0 and env.store.values == {"fig": 3}
    assert env.stats.as_metrics()[f"malformed_{kind}"] == 1


def test_too_many_calls_in_a_turn_and_an_episode() -> None:
    env = ToolEnvironment(FMT, {"fig": 3}, limits=ToolLimits(max_calls_per_turn=2, max_calls_per_episode=3))
    step = env.step(_call("kv_get", key="fig") * 3)
    assert [o.error for o in step.outcomes] == [None, None, TOO_MANY_TURN]
    step = env.step(_call("kv_get", key="fig") + _call("kv_set", key="fig", value=9))
    assert [o.error for o in step.outcomes] == [TOO_MANY_EPISODE, TOO_MANY_EPISODE]
    assert env.store.values == {"fig": 3}  # calls past the limit never run
    assert env.stats.malformed == {TOO_MANY_TURN: 1, TOO_MANY_EPISODE: 2}
    assert env.stats.calls == 2


def test_environment_offers_only_its_tools() -> None:
    with pytest.raises(ValueError, match=r"tools: unknown or unavailable tool\(s\) \['python'\]"):
        ToolEnvironment(FMT, {}, tools=("kv_get", "python"))
    env = ToolEnvironment(FMT, {}, tools=("calc",))
    assert [s["function"]["name"] for s in env.schemas] == ["calc"]
    assert env.step(_call("kv_get", key="fig")).outcomes[0].error == UNKNOWN_TOOL


def test_tiny_tokenizer_carries_the_tool_template() -> None:
    """`cascade model init`'s tokenizer: the format comes from its own apply_chat_template."""
    from cascade.bootstrap.tokenizer import train_tokenizer
    from cascade.tools.template import format_of_tokenizer

    tokenizer = train_tokenizer(["What is fig? <tool_call> 1 2 3 </tool_call>"] * 20, vocab_size=300)
    assert format_of_tokenizer(tokenizer) == FMT
    chat = [{"role": "user", "content": "u"}]
    plain = template_renderer(CHAT_TEMPLATE, False)(chat, None, True)
    assert (
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, enable_thinking=False, tokenize=False)
        == plain
    )

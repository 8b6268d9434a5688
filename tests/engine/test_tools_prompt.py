"""engine/tools/prompt.py: what a chat template renders for tools, tool calls and results.

SmolLM2-135M-Instruct's template (plain ChatML, no tools) is rendered as the tokenizer renders
it (a jinja sandbox with trim_blocks and lstrip_blocks).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.tools import (
    ToolError,
    parse_complete,
    parse_tools,
    prompt_messages,
    template_has_tools,
    tools_system_text,
)

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The tool parts of Qwen2.5's template, shortened.
WITH_TOOLS = (
    "{% if tools %}<|im_start|>system\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
USER = {"role": "user", "content": "Weather in Oslo and Rome?"}
CALLS: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
        },
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
        },
    ],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call_a", "content": "12 C"},
    {"role": "tool", "tool_call_id": "call_b", "content": "25 C"},
]


def render(template: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text: str = env.from_string(template).render(
        messages=messages, add_generation_prompt=True, **extra
    )
    return text


def test_the_system_prompt_format() -> None:
    spec = parse_tools({"tools": [WEATHER]})
    assert spec is not None
    tool = json.dumps(WEATHER)
    assert tools_system_text(spec.tools) == (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tool}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    assert "at most one function" in tools_system_text(spec.tools, parallel=False)


def test_tools_become_the_first_system_message() -> None:
    spec = parse_tools({"tools": [WEATHER]})
    assert spec is not None
    text = tools_system_text(spec.tools)
    prompt = prompt_messages([USER], spec, template_has_tools=False)
    assert prompt.messages == [{"role": "system", "content": text}, USER]
    assert prompt.tools is None
    system = {"role": "system", "content": "Be brief."}
    prompt = prompt_messages([system, USER], spec, template_has_tools=False)
    assert prompt.messages[0] == {"role": "system", "content": f"Be brief.\n\n{text}"}
    assert prompt.messages[1:] == [USER]


def test_calls_and_results_render_in_the_hermes_format() -> None:
    answer = {"role": "assistant", "content": "Oslo is colder."}
    messages = [USER, CALLS, *RESULTS, answer]
    prompt = prompt_messages(messages, None, template_has_tools=False)
    assert render(SMOLLM2, prompt.messages) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n"
        "<|im_start|>user\nWeather in Oslo and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n12 C\n</tool_response>\n<tool_response>\n25 C\n</tool_response>"
        "<|im_end|>\n"
        "<|im_start|>assistant\nOslo is colder.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_rendered_call_parses_back_to_itself() -> None:
    with_content = {**CALLS, "content": "Let me look."}
    prompt = prompt_messages([USER, with_content], None, template_has_tools=False)
    content, calls = parse_complete(prompt.messages[1]["content"], frozenset({"get_weather"}))
    assert content == "Let me look."
    sent = [(c["function"]["name"], c["function"]["arguments"]) for c in CALLS["tool_calls"]]
    sent = [(name, json.loads(arguments)) for name, arguments in sent]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == sent


def test_tool_results_apart_are_separate_user_turns() -> None:
    messages = [USER, CALLS, RESULTS[0], USER, RESULTS[1]]
    prompt = prompt_messages(messages, None, template_has_tools=False)
    assert [m["role"] for m in prompt.messages] == ["user", "assistant", "user", "user", "user"]
    assert prompt.messages[2]["content"] == "<tool_response>\n12 C\n</tool_response>"


def test_a_template_with_tools_gets_them_and_the_messages_as_they_are() -> None:
    assert template_has_tools(WITH_TOOLS)
    spec = parse_tools({"tools": [WEATHER]})
    prompt = prompt_messages([USER, CALLS, *RESULTS], spec, template_has_tools=True)
    assert prompt.tools == [WEATHER]
    assert prompt.messages[0] == USER
    assert prompt.messages[1]["content"] == ""
    first = prompt.messages[1]["tool_calls"][0]
    assert first == {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
    }
    assert prompt.messages[2] == RESULTS[0]
    rendered = render(WITH_TOOLS, prompt.messages, tools=prompt.tools)
    assert '"name": "get_weather"' in rendered
    assert '<tool_call>get_weather {"city": "Oslo"}</tool_call>' in rendered


def test_without_tools_in_play_nothing_is_shown() -> None:
    spec = parse_tools({"tools": [WEATHER], "tool_choice": "none"})
    assert prompt_messages([USER], spec, template_has_tools=False).messages == [USER]
    assert prompt_messages([USER], spec, template_has_tools=True).tools is None


@pytest.mark.parametrize("template", [SMOLLM2, None, "{% for %}", "{{ 'tools' }}"])
def test_templates_without_tools(template: str | None) -> None:
    assert not template_has_tools(template)


def test_a_bad_history_is_refused_naming_the_message() -> None:
    bad = {**CALLS, "tool_calls": [{**CALLS["tool_calls"][0], "id": None}]}
    with pytest.raises(ToolError) as caught:
        prompt_messages([USER, bad], None, template_has_tools=True)
    assert caught.value.param == "messages[1].tool_calls[0].id"

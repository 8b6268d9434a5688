"""engine/tools/spec.py and history.py: tool fields and tool-call history, each refusal naming
the parameter to fix."""

from __future__ import annotations

from typing import Any

import pytest

from engine.tools import Tool, ToolChoice, ToolError, check_history, parse_tools


def function(name: str = "get_weather", **more: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **more}}


WEATHER = function(
    description="The weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    strict=True,
)


def test_tools_default_to_auto_and_parallel() -> None:
    spec = parse_tools({"tools": [WEATHER, function("now")]})
    assert spec is not None
    assert spec.choice == ToolChoice("auto") and spec.parallel
    assert spec.names == {"get_weather", "now"}
    weather = spec.tool("get_weather")
    assert weather == Tool(
        "get_weather",
        "The weather in a city",
        {"type": "object", "properties": {"city": {"type": "string"}}},
        strict=True,
    )


def test_parameters_are_always_an_object_schema() -> None:
    spec = parse_tools({"tools": [function("now"), function("f", parameters={"required": []})]})
    assert spec is not None
    assert spec.tool("now").parameters == {"type": "object"}
    assert spec.tool("f").parameters == {"type": "object", "required": []}
    assert spec.tool("now").openai() == {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object"}},
    }


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"tools": None},
        {"tools": []},
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tool_choice": "none"},
        {"tool_choice": "auto"},
    ],
)
def test_no_tools_in_play_is_none(body: dict[str, Any]) -> None:
    assert parse_tools(body) is None


def test_required_named_and_not_parallel() -> None:
    spec = parse_tools({"tools": [WEATHER], "tool_choice": "required"})
    assert spec is not None
    assert spec.choice == ToolChoice("required") and spec.parallel
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"tools": [WEATHER], "tool_choice": named, "parallel_tool_calls": False}
    spec = parse_tools(body)
    assert spec is not None
    assert spec.choice == ToolChoice("named", "get_weather") and not spec.parallel


NAMED = {"type": "function", "function": {"name": "nope"}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": {}}, "tools"),
        ({"tools": ["x"]}, "tools[0]"),
        ({"tools": [WEATHER, {"type": "custom", "custom": {}}]}, "tools[1].custom"),
        ({"tools": [WEATHER, {"type": "custom"}]}, "tools[1].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": []}]}, "tools[0].function"),
        ({"tools": [WEATHER, function("a b")]}, "tools[1].function.name"),
        ({"tools": [function("x" * 65)]}, "tools[0].function.name"),
        ({"tools": [function("")]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, function("now"), WEATHER]}, "tools[2].function.name"),
        ({"tools": [function(description=3)]}, "tools[0].function.description"),
        ({"tools": [function(strict="yes")]}, "tools[0].function.strict"),
        ({"tools": [function(parameters=[])]}, "tools[0].function.parameters"),
        ({"tools": [function(parameters="{}")]}, "tools[0].function.parameters"),
        (
            {"tools": [function(parameters={"type": "string"})]},
            "tools[0].function.parameters.type",
        ),
        ({"tools": [function(examples=[])]}, "tools[0].function.examples"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": 1}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": NAMED}, "tool_choice.function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.function"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "function": {}}},
            "tool_choice.type",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": 1}}},
            "tool_choice.function.name",
        ),
        ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_bad_tool_fields_name_their_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ToolError) as caught:
        parse_tools(body)
    assert caught.value.param == param
    assert isinstance(caught.value, ValueError) and str(caught.value)


def call(
    arguments: Any = '{"city": "Oslo"}', name: Any = "get_weather", **more: Any
) -> dict[str, Any]:
    entry = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {**entry, **more}


def assistant(*calls: Any, content: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


USER = {"role": "user", "content": "Weather in Oslo?"}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}


def test_a_good_history_passes() -> None:
    check_history([USER, assistant(call()), RESULT, {"role": "assistant", "content": "12 C."}])
    check_history([USER, assistant(call(), content="Let me look."), RESULT])


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "function", "content": "x"}], "messages[0].role"),
        ([USER, {"role": "user", "content": None}], "messages[1].content"),
        ([USER, {"role": "user", "content": "x", "tool_calls": []}], "messages[1].tool_calls"),
        ([USER, {"role": "assistant", "tool_calls": {}}], "messages[1].tool_calls"),
        ([USER, assistant(call(), content=3)], "messages[1].content"),
        ([USER, assistant("x")], "messages[1].tool_calls[0]"),
        ([USER, assistant(call(), call(id=""))], "messages[1].tool_calls[1].id"),
        ([USER, assistant(call(type="code"))], "messages[1].tool_calls[0].type"),
        ([USER, assistant(call(function=None))], "messages[1].tool_calls[0].function"),
        ([USER, assistant(call(name=""))], "messages[1].tool_calls[0].function.name"),
        ([USER, assistant(call("{"))], "messages[1].tool_calls[0].function.arguments"),
        ([USER, assistant(call({"a": 1}))], "messages[1].tool_calls[0].function.arguments"),
        ([USER, assistant(call("[1]"))], "messages[1].tool_calls[0].function.arguments"),
        ([USER, assistant(call()), {"role": "tool", "content": "x"}], "messages[2].tool_call_id"),
        ([USER, assistant(call()), {**RESULT, "content": None}], "messages[2].content"),
    ],
)
def test_bad_history_names_its_param(messages: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(ToolError) as caught:
        check_history(messages)
    assert caught.value.param == param

"""Tool calls and tool results in a conversation's history, checked before they are rendered.

The input is the server's message list with each content already a string (text parts
joined): roles system, user, assistant and tool. An assistant message may carry `tool_calls`
(then its content may be null); each call needs an id, type "function", a function name and
arguments as a JSON string holding an object. A tool message needs `tool_call_id` and a string
content. Whether a tool message answers an earlier call is not checked (vLLM does not either):
the prompt formats do not need the ids.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.tools.errors import ToolError

ROLES = ("system", "user", "assistant", "tool")


def check_history(messages: Sequence[Mapping[str, Any]]) -> None:
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in ROLES:
            param = f"{where}.role"
            raise ToolError(f"'{param}' must be one of {list(ROLES)}, got {role!r}", param)
        if role == "tool":
            _tool_result(message, where)
        elif message.get("tool_calls") is not None:
            if role != "assistant":
                param = f"{where}.tool_calls"
                raise ToolError(f"'{param}' is only allowed on assistant messages", param)
            _assistant_calls(message, where)
        else:
            _string(message.get("content"), f"{where}.content")


def _tool_result(message: Mapping[str, Any], where: str) -> None:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        param = f"{where}.tool_call_id"
        raise ToolError(f"'{param}' is required on tool messages: the id of the call", param)
    _string(message.get("content"), f"{where}.content")


def _assistant_calls(message: Mapping[str, Any], where: str) -> None:
    content = message.get("content")
    if content is not None:
        _string(content, f"{where}.content")
    calls = message["tool_calls"]
    if not isinstance(calls, list):
        raise ToolError(f"'{where}.tool_calls' must be an array", f"{where}.tool_calls")
    for j, call in enumerate(calls):
        _call(call, f"{where}.tool_calls[{j}]")


def _call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise ToolError(f"'{where}' must be an object", where)
    if not isinstance(call.get("id"), str) or not call["id"]:
        raise ToolError(f"'{where}.id' is required and must be a string", f"{where}.id")
    if call.get("type") != "function":
        param = f"{where}.type"
        raise ToolError(f"'{param}' must be 'function', got {call.get('type')!r}", param)
    function = call.get("function")
    if not isinstance(function, dict):
        param = f"{where}.function"
        raise ToolError(f"'{param}' is required and must be an object", param)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        param = f"{where}.function.name"
        raise ToolError(f"'{param}' is required and must be a string", param)
    call_arguments(function.get("arguments"), f"{where}.function.arguments")


def call_arguments(arguments: Any, param: str) -> dict[str, Any]:
    """A history call's arguments: the JSON text of an object, decoded."""
    if not isinstance(arguments, str):
        raise ToolError(f"'{param}' is required and must be a string of JSON", param)
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        raise ToolError(f"'{param}' is not valid JSON: {exc}", param) from None
    if not isinstance(value, dict):
        raise ToolError(f"'{param}' must be the JSON text of an object", param)
    return value


def _string(content: Any, param: str) -> None:
    if not isinstance(content, str):
        raise ToolError(f"'{param}' must be a string", param)

"""OpenAI `tools`, `tool_choice` and `parallel_tool_calls` -> one validated `ToolSpec`.

Each tool is `{"type": "function", "function": {"name", "description"?, "parameters"?,
"strict"?}}`; `tool_choice` is "none", "auto", "required" or `{"type": "function", "function":
{"name": ...}}`. As OpenAI does: `tool_choice` defaults to "auto" with tools and "none"
without; "required" or a named function without tools is refused. An empty `tools` array is
taken as no tools. Unknown keys inside a tool or a named choice are refused, like any request
field this engine does not know. The legacy `functions` / `function_call` are not read here
(the server refuses them: send `tools`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from engine.tools.errors import ToolError

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
Mode = Literal["none", "auto", "required", "named"]

_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})


@dataclass(frozen=True, slots=True)
class Tool:
    """One function. `parameters` is always an object schema: `{"type": "object"}` when the
    request gave none, and `"type": "object"` added when the given schema left it out."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]
    strict: bool

    def openai(self) -> dict[str, Any]:
        """The tool as the model sees it (and as a chat template's `tools` gets it)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Mode
    name: str | None = None  # the function, when mode is "named"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """Tools that take part in a request: shown to the model, and its output parsed for calls.
    `parallel` False means at most one call (exactly one under "required")."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool = True

    @property
    def names(self) -> frozenset[str]:
        return frozenset(tool.name for tool in self.tools)

    def tool(self, name: str) -> Tool:
        return next(tool for tool in self.tools if tool.name == name)


def parse_tools(body: Mapping[str, Any]) -> ToolSpec | None:
    """The request's tool fields, validated; None when tools play no part in the answer (no
    tools, or tool_choice "none": then the tools are not shown and no call is parsed)."""
    tools = _tools(body.get("tools"))
    choice = _choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if choice.mode == "none" or not tools:
        return None
    return ToolSpec(tools, choice, parallel is not False)


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ToolError("'tools' must be an array of function tools", "tools")
    tools = tuple(_tool(item, f"tools[{i}]") for i, item in enumerate(value))
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            param = f"tools[{i}].function.name"
            raise ToolError(f"'{param}': the function name {tool.name!r} is used twice", param)
        seen.add(tool.name)
    return tools


def _tool(item: Any, where: str) -> Tool:
    _object(item, where, _TOOL_KEYS)
    kind = item.get("type")
    if kind != "function":
        param = f"{where}.type"
        raise ToolError(f"'{param}' must be 'function' (the only tool type), got {kind!r}", param)
    function = item.get("function")
    where = f"{where}.function"
    if function is None:
        raise ToolError(f"'{where}' is required", where)
    _object(function, where, _FUNCTION_KEYS)
    name = _name(function.get("name"), f"{where}.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolError(f"'{where}.description' must be a string", f"{where}.description")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ToolError(f"'{where}.strict' must be a boolean", f"{where}.strict")
    parameters = _parameters(function.get("parameters"), f"{where}.parameters")
    return Tool(name, description, parameters, bool(strict))


def _name(name: Any, param: str) -> str:
    if not isinstance(name, str):
        raise ToolError(f"'{param}' is required and must be a string", param)
    if not NAME.fullmatch(name):
        message = f"'{param}' must be 1 to 64 of a-z, A-Z, 0-9, '_' and '-', got {name!r}"
        raise ToolError(message, param)
    return name


def _parameters(value: Any, param: str) -> dict[str, Any]:
    """Arguments are a JSON object, so the schema must describe one."""
    if value is None:
        return {"type": "object"}
    if not isinstance(value, dict):
        raise ToolError(f"'{param}' must be a JSON Schema object", param)
    kind = value.get("type", "object")
    if kind != "object":
        message = f"'{param}.type' must be 'object' (arguments are a JSON object), got {kind!r}"
        raise ToolError(message, f"{param}.type")
    return {"type": "object", **value}


def _choice(value: Any, tools: tuple[Tool, ...]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise ToolError("'tool_choice' is 'required' but no 'tools' are given", "tool_choice")
        return ToolChoice(value)
    if isinstance(value, str):
        message = "'tool_choice' must be 'none', 'auto', 'required' or a named function"
        raise ToolError(f"{message}, got {value!r}", "tool_choice")
    return ToolChoice("named", _named(value, tools))


def _named(value: Any, tools: tuple[Tool, ...]) -> str:
    _object(value, "tool_choice", _TOOL_KEYS)
    if value.get("type") != "function":
        message = f"'tool_choice.type' must be 'function', got {value.get('type')!r}"
        raise ToolError(message, "tool_choice.type")
    function = value.get("function")
    if function is None:
        raise ToolError("'tool_choice.function' is required", "tool_choice.function")
    _object(function, "tool_choice.function", frozenset({"name"}))
    param = "tool_choice.function.name"
    name = function.get("name")
    if not isinstance(name, str):
        raise ToolError(f"'{param}' is required and must be a string", param)
    if not tools:
        raise ToolError("'tool_choice' names a function but no 'tools' are given", "tool_choice")
    if name not in {tool.name for tool in tools}:
        raise ToolError(f"'{param}': no tool is named {name!r}", param)
    return name


def _object(value: Any, where: str, keys: frozenset[str]) -> None:
    if not isinstance(value, dict):
        raise ToolError(f"'{where}' must be an object", where)
    unknown = sorted(set(value) - keys)
    if unknown:
        param = f"{where}.{unknown[0]}"
        raise ToolError(f"Unrecognized argument '{param}'", param)

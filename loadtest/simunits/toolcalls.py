"""Tool calls of the simulated units (a test tool): which tool to call and the call's wire shape.

A rollout gate that checks tool calling needs answers it can verify without a model, so the
call is fixed by the request: it goes to the tool `tool_choice` names (else the first one),
and its arguments give every property of the tool's `parameters` schema one value per type
("x", 1, true, ...). A revision that breaks tool calling is a unit setting (`ToolsMode`):
plain text instead of a call, or arguments that are not JSON.

Streamed, a call is OpenAI's `delta.tool_calls`: the first delta carries index, id, type
and the function's name with empty arguments, the next ones pieces of the arguments.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from loadtest.simunits.params import ParamError
from loadtest.simunits.state import ToolsMode

PIECE_CHARS = 4
"""Characters of the arguments per streamed delta, about what a tokenizer gives per token."""

_SCALARS: dict[str, object] = {
    "string": "x",
    "number": 1,
    "integer": 1,
    "boolean": True,
    "null": None,
}


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    parameters: Mapping[str, object]


def _tool(item: object, index: int) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(item, Mapping) or item.get("type") != "function":
        raise ParamError(where, 'must be an object with "type": "function"')
    function = item.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(name, str) or not name:
        raise ParamError(f"{where}.function.name", "must be a non-empty string")
    parameters = function.get("parameters", {})
    if not isinstance(parameters, Mapping):
        raise ParamError(f"{where}.function.parameters", "must be a JSON schema object")
    return Tool(name, parameters)


def _named(choice: object, tools: Sequence[Tool]) -> Tool:
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    for tool in tools:
        if tool.name == name:
            return tool
    raise ParamError(
        "tool_choice",
        'must be "none", "auto", "required" or {"type": "function", "function": {"name": N}} '
        "naming one of the tools",
    )


def parse_tool(body: Mapping[str, object]) -> Tool | None:
    """The tool a chat answer calls; None when the request offers none or forbids calls."""
    raw = body.get("tools")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ParamError("tools", "must be a list")
    tools = [_tool(item, index) for index, item in enumerate(raw)]
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    if choice in ("auto", "required"):
        return tools[0]
    return _named(choice, tools)


def _type(schema: Mapping[str, object]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first type that is not null
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    return "object" if "properties" in schema else "string"


def example_value(schema: object) -> object:
    """A fixed value valid for `schema`: its const or first enum value, else one per type."""
    if not isinstance(schema, Mapping):
        return "x"
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = _type(schema)
    if kind == "object":
        return example_object(schema)
    if kind == "array":
        return [example_value(schema.get("items"))]
    return _SCALARS.get(kind, "x")


def example_object(schema: Mapping[str, object]) -> dict[str, object]:
    """Every property of an object schema, each with its `example_value`."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    return {str(name): example_value(sub) for name, sub in properties.items()}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One answer's call; its tokens are the name (token 0), then the arguments' pieces."""

    id: str
    name: str
    arguments: str

    @property
    def pieces(self) -> list[str]:
        text = self.arguments
        return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]

    @property
    def token_count(self) -> int:
        return 1 + len(self.pieces)

    def delta(self, index: int) -> dict[str, object]:
        """The streamed delta of token `index`."""
        if index == 0:
            function = {"name": self.name, "arguments": ""}
            call = {"index": 0, "id": self.id, "type": "function", "function": function}
        else:
            call = {"index": 0, "function": {"arguments": self.pieces[index - 1]}}
        return {"tool_calls": [call]}

    def message_call(self, completion_tokens: int) -> dict[str, object]:
        """The call as a whole message carries it, cut to `completion_tokens` tokens."""
        arguments = "".join(self.pieces[: max(0, completion_tokens - 1)])
        function = {"name": self.name, "arguments": arguments}
        return {"id": self.id, "type": "function", "function": function}


def tool_call(tool: Tool | None, mode: ToolsMode, response_id: str) -> ToolCall | None:
    """The call a unit in `mode` answers, or None for a plain-text answer.

    The id has the shape of OpenAI's (`call_` and 24 letters and digits) but derives from
    the response's id, so a relayed answer can be compared byte for byte with a direct one,
    as every other body of the simulated units can.
    """
    if tool is None or mode is ToolsMode.TEXT:
        return None
    arguments = orjson.dumps(example_object(tool.parameters)).decode()
    if mode is ToolsMode.BAD_JSON:
        arguments = arguments[:-1]  # an object without its closing brace never parses
    call_id = "call_" + hashlib.sha256(response_id.encode()).hexdigest()[:24]
    return ToolCall(call_id, tool.name, arguments)


def tool_call_length(max_tokens: int | None, call: ToolCall, cap: int) -> tuple[int, str]:
    """Tokens to emit and the finish_reason: "length" when max_tokens cuts the call short."""
    limit = cap if max_tokens is None else min(max_tokens, cap)
    count = min(call.token_count, limit)
    return count, "tool_calls" if count == call.token_count else "length"

"""tools -> an llguidance lark grammar: calls forced ("required", a named function) or allowed.

The answer must be one call (or, for "required" with parallel calls allowed, one or more
separated by a newline) in the format of `format.py`:

    <tool_call>
    {"name": "<one of the tools>", "arguments": <an object of that tool's schema>}
    </tool_call>

The name is a literal of the grammar and each tool's schema is its own `%json` document (so a
schema's `$ref`s to its own `$defs` resolve). The JSON is written with fixed separators and no
other whitespace, the form of the prompt's history, which also keeps a small model from
padding without end. As for `response_format`: a tool with `strict: true` has every schema
keyword enforced (a keyword llguidance cannot enforce makes the grammar fail to compile);
otherwise such keywords are ignored (lenient). With "auto" the answer is either text that does
not begin with "<tool", or calls as with "required".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.grammar.bounds import exact_number_ranges
from engine.tools.format import CLOSE, OPEN
from engine.tools.spec import Tool, ToolSpec

_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _literal(text: str) -> str:
    """A lark string literal: JSON's string escapes are lark's."""
    return json.dumps(text, ensure_ascii=False)


_CALL = "call: {} function {}".format(_literal(OPEN + '\n{"name": '), _literal("}\n" + CLOSE))


# "auto": any text that does not begin with "<tool", or calls. A model that starts a tag is
# held to a well-formed call (a small model otherwise drifts into "<tool_response>" or
# arguments of its own invention); a text answer is free but for its first five characters.
_AUTO_TEXT = "TEXT: /(?s:.+)/ & ~/(?s:<tool.*)/"


def tool_grammar(spec: ToolSpec | None) -> str | None:
    if spec is None:
        return None
    if spec.choice.mode == "named":
        tools: tuple[Tool, ...] = (spec.tool(str(spec.choice.name)),)
    else:
        tools = spec.tools
    repeat = spec.choice.mode != "named" and spec.parallel
    calls = 'calls: call ("\\n" call)*' if repeat else "calls: call"
    lines = [
        "start: TEXT | calls" if spec.choice.mode == "auto" else "start: calls",
        calls,
        *([_AUTO_TEXT] if spec.choice.mode == "auto" else []),
        _CALL,
        "function: " + " | ".join(f"function_{i}" for i in range(len(tools))),
    ]
    for i, tool in enumerate(tools):
        head = _literal(json.dumps(tool.name) + ', "arguments": ')
        lines.append(f"function_{i}: {head} arguments_{i}")
        lines.append(f"arguments_{i}: %json {_schema(tool)}")
    return "\n".join(lines) + "\n"


def _schema(tool: Tool) -> str:
    """The tool's schema for `%json`; a number range llguidance would get wrong is refused
    (strict) or made inclusive (engine/grammar/bounds.py)."""
    options: Mapping[str, Any] = {**_LAYOUT, "lenient": not tool.strict}
    where = f"tools.{tool.name}.parameters"
    parameters = exact_number_ranges(tool.parameters, tool.strict, where)
    return json.dumps({**parameters, "x-guidance": options}, ensure_ascii=False)

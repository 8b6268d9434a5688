"""The Hermes/Qwen tool-call text format, the one place that spells it.

The model is told about tools in its system prompt, as JSON lines inside `<tools></tools>`,
and answers with calls `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
(several separated by a newline). Tool results come back as a user turn of
`<tool_response>\\n...\\n</tool_response>` blocks. The JSON is written with `json.dumps`'
default separators (", " and ": "), which the grammar for forced calls uses too, so the model
sees in its history the exact form it is made to write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.tools.spec import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"

_INTRO = {
    True: "You may call one or more functions to assist with the user query.",
    False: "You may call at most one function to assist with the user query.",
}
_TEMPLATE = """# Tools

{intro}

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def tools_system_text(tools: Sequence[Tool], parallel: bool = True) -> str:
    """The system-prompt text that shows the tools to a model whose template cannot."""
    lines = "\n".join(json.dumps(tool.openai(), ensure_ascii=False) for tool in tools)
    return _TEMPLATE.format(intro=_INTRO[parallel], tools=lines)


def call_text(name: str, arguments: Mapping[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def response_text(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"

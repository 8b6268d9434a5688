"""OpenAI tool calls for the builtin engine: request validation, the prompt format, the
grammar that forces a call, and the parsers that find calls in the model's text.

Pure Python (json, re, jinja2 for template inspection); the server wires it in:
`parse_tools` -> `prompt_messages` -> `tool_grammar` -> `parse_complete` / `ToolStream`.
"""

from engine.tools.calls import ToolCall, finish_reason, random_call_id
from engine.tools.errors import ToolError
from engine.tools.format import tools_system_text
from engine.tools.grammar import tool_grammar
from engine.tools.history import check_history
from engine.tools.parser import parse_complete
from engine.tools.prompt import Prompt, prompt_messages, template_has_tools
from engine.tools.spec import Tool, ToolChoice, ToolSpec, parse_tools
from engine.tools.stream import CallDelta, Delta, TextDelta, ToolStream

__all__ = [
    "CallDelta",
    "Delta",
    "Prompt",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolError",
    "ToolSpec",
    "ToolStream",
    "check_history",
    "finish_reason",
    "parse_complete",
    "parse_tools",
    "prompt_messages",
    "random_call_id",
    "template_has_tools",
    "tool_grammar",
    "tools_system_text",
]

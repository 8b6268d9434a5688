"""Messages with tool calls and tool results -> what the chat template renders.

A template that handles tools itself (its jinja text reads a `tools` variable, as Qwen's,
Llama 3.1's and Mistral's do) gets the messages as they are, with each call's arguments
decoded to an object (the Hugging Face convention: templates write them with `tojson`),
plus the tools to pass as its `tools`. Any other template (SmolLM2's plain ChatML, the
minimal one, the byte tokenizer's) sees only system, user and assistant turns of text, in the
Hermes format of `format.py`:

- the tools text is appended to the first message when it is a system message (after a blank
  line), or else becomes a new first system message;
- an assistant message with `tool_calls` becomes its content (if any), a newline, and one
  `<tool_call>` block per call, separated by newlines;
- consecutive tool messages become one user turn of `<tool_response>` blocks, separated by
  newlines (as Qwen's template does).

With no tools in play (`spec` None, which includes tool_choice "none") the tools are not
shown, but calls and results in the history are still rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from engine.tools.format import call_text, response_text, tools_system_text
from engine.tools.history import call_arguments, check_history
from engine.tools.spec import ToolSpec


@dataclass(frozen=True, slots=True)
class Prompt:
    """What to hand the tokenizer: `messages`, and `tools` for the template's `tools` variable
    (None when the template does not take them or no tools are shown)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


def prompt_messages(
    messages: Sequence[Mapping[str, Any]], spec: ToolSpec | None, template_has_tools: bool
) -> Prompt:
    """Raises ToolError (naming `messages[i]...`) for a malformed call or tool result."""
    check_history(messages)
    if template_has_tools:
        tools = [tool.openai() for tool in spec.tools] if spec else None
        return Prompt([_native(m) for m in messages], tools)
    turns = _merge_results([_as_text(m) for m in messages])
    if spec:
        turns = _with_system(turns, tools_system_text(spec.tools, spec.parallel))
    return Prompt(turns)


@lru_cache(maxsize=8)
def template_has_tools(template: str | None) -> bool:
    """Whether a jinja chat template reads a `tools` variable (False if it does not parse).
    Cached: a served model has one template, and parsing it takes milliseconds."""
    if not isinstance(template, str):
        return False
    from jinja2 import TemplateError, meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        return "tools" in meta.find_undeclared_variables(env.parse(template))
    except TemplateError:
        return False


def _native(message: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    if message["role"] == "tool":
        out["tool_call_id"] = message["tool_call_id"]
    elif message.get("tool_calls") is not None:
        out["tool_calls"] = [_native_call(call) for call in message["tool_calls"]]
    return out


def _native_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call["function"]
    arguments = call_arguments(function["arguments"], "arguments")
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _as_text(message: Mapping[str, Any]) -> dict[str, str]:
    role, content = message["role"], message.get("content") or ""
    if role == "tool":
        return {"role": "tool", "content": response_text(content)}
    calls = message.get("tool_calls") or []
    blocks = [_call_text(call) for call in calls]
    return {"role": role, "content": "\n".join([content, *blocks] if content else blocks)}


def _call_text(call: Mapping[str, Any]) -> str:
    function = call["function"]
    return call_text(function["name"], call_arguments(function["arguments"], "arguments"))


def _merge_results(turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """Tool results become user turns, consecutive ones one turn."""
    out: list[dict[str, str]] = []
    for i, turn in enumerate(turns):
        if turn["role"] != "tool":
            out.append(turn)
        elif i > 0 and turns[i - 1]["role"] == "tool":
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + turn["content"]}
        else:
            out.append({"role": "user", "content": turn["content"]})
    return out


def _with_system(turns: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    if turns and turns[0]["role"] == "system":
        first = turns[0]["content"]
        joined = f"{first}\n\n{text}" if first else text
        return [{"role": "system", "content": joined}, *turns[1:]]
    return [{"role": "system", "content": text}, *turns]

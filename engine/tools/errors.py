"""The one error type of tool-call requests: a ValueError that names the bad parameter."""

from __future__ import annotations


class ToolError(ValueError):
    """A request's tools, tool_choice or tool-call history is unusable; `param` is the path of
    the offending field (`tools[1].function.name`, `messages[3].tool_call_id`), as OpenAI's
    error `param` spells it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param

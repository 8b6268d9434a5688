"""A parsed tool call as OpenAI sends it, its id, and the finish_reason rule."""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_ALPHABET = string.ascii_letters + string.digits

CallIds = Callable[[], str]  # makes one call id per call; tests pass a deterministic one


def random_call_id() -> str:
    """`call_` and 24 random letters and digits, the shape of OpenAI's ids."""
    return "call_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # compact JSON text of an object, as OpenAI sends it

    def openai(self) -> dict[str, Any]:
        """The entry of a response message's `tool_calls`."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


def finish_reason(engine_reason: str, calls: int) -> str:
    """The choice's finish_reason: "tool_calls" once a call was parsed (even if the answer was
    then cut short), else the engine's own ("stop", "length")."""
    return "tool_calls" if calls > 0 else engine_reason

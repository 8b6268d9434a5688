"""A request's place in admission: its priority class, its tenant, its estimated tokens.

The class comes from the `x-unitgate-priority` header, clamped to the caller's highest class
(its API key's), else the caller's default, else `[priority].default`. An unknown class is the
client's mistake (400 naming the classes there are). With `[priority]` set the gateway owns
the `priority` a unit schedules by, so a body's own `priority` is refused by name; units that
schedule by it get the class's `unit_priority` spliced into the body (`with_priority`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config.priority import PriorityConfig
from gateway.errors import InvalidRequest
from gateway.proxy.jsonbody import first_member
from gateway.routing.admission import Ask

HEADER = "x-unitgate-priority"
MAX_HEADER = 64  # a class name is at most 32 characters; longer is not a class
# A request without max_tokens may run to the unit's context; admission still needs a number.
DEFAULT_COMPLETION_TOKENS = 256
CHARS_PER_TOKEN = 4  # the usual English estimate; settled with the real count at the end


def ask_of(
    headers: Mapping[str, str],
    data: dict[str, Any],
    body_bytes: int,
    classes: PriorityConfig,
    tenant: str,
    highest: str | None = None,
    default: str = "",
) -> Ask:
    """The request's Ask; InvalidRequest (400) for a class that does not exist."""
    asked = headers.get(HEADER)
    try:
        if asked is not None and len(asked) > MAX_HEADER:
            raise KeyError(asked)
        klass = classes.resolve(asked, highest, default)
    except KeyError:
        names = ", ".join(c.name for c in classes.ranked)
        shown = asked if asked is None or len(asked) <= MAX_HEADER else asked[:MAX_HEADER] + "..."
        raise InvalidRequest(
            f"{HEADER}: unknown priority class {shown!r}; this gateway has: {names}",
            code="unknown_priority_class",
            param=HEADER,
        ) from None
    return Ask(klass, tenant, estimate_tokens(data, body_bytes))


def refuse_own_priority(data: dict[str, Any]) -> None:
    """With classes, a unit's `priority` is the gateway's to set, never the client's."""
    if "priority" in data:
        raise InvalidRequest(
            f"priority: set by the gateway from the request's class; ask for a class with the "
            f"{HEADER} header instead",
            code="unsupported_field",
            param="priority",
        )


def estimate_tokens(data: dict[str, Any], body_bytes: int) -> int:
    """Prompt tokens (the body's size / 4) plus the completion it may have."""
    most = data.get("max_completion_tokens", data.get("max_tokens"))
    completion = most if isinstance(most, int) and most > 0 else DEFAULT_COMPLETION_TOKENS
    return body_bytes // CHARS_PER_TOKEN + completion


def with_priority(body: bytes, value: int) -> bytes:
    """`body` (a JSON object without `priority`) with `"priority": value` as its first member:
    spliced in rather than re-encoded, since the request path pays for every byte it parses."""
    return first_member(body, b'"priority":%d' % value)

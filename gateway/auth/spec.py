"""A new key's settings from the admin API's body, every field checked, each error naming it.

    {"tenant", "priority"?, "default_priority"?, "rpm"?, "tpm"?, "max_inflight"?, "expires"?}

`priority` is the highest class the key's requests may run in (default: `[priority].default`),
`default_priority` the class of those that ask for none (default: `priority`; it may not rank
above it). Limits are positive integers or null (unlimited). `expires` is Unix seconds or an
RFC 3339 time, in the future; null or absent: never.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.config import Config

FIELDS = ("tenant", "priority", "default_priority", "rpm", "tpm", "max_inflight", "expires")
LIMITS = ("rpm", "tpm", "max_inflight")
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_LIMIT = 2**53  # a JSON number every client reads exactly


class SpecError(ValueError):
    """The body is not a valid key: the message names the field and the value."""


@dataclass(frozen=True, slots=True)
class KeySpec:
    tenant: str
    priority: str
    default_priority: str
    rpm: int | None
    tpm: int | None
    max_inflight: int | None
    expires: float | None


def class_names(config: Config) -> tuple[str, ...]:
    """The priority classes a key may name, most important first: the configured ones, or
    "standard" alone where the gateway has no classes."""
    if config.priority is None:
        return ("standard",)
    return tuple(c.name for c in config.priority.ranked)


def default_class(config: Config) -> str:
    return "standard" if config.priority is None else config.priority.default


def parse(body: object, config: Config, now: float) -> KeySpec:
    if not isinstance(body, dict):
        raise SpecError('the body must be a JSON object like {"tenant": "acme"}')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise SpecError(f"unknown key [body].{unknown[0]}; known keys: {list(FIELDS)}")
    tenant = body.get("tenant")
    if not isinstance(tenant, str) or not TENANT.fullmatch(tenant):
        raise SpecError(
            f"[body].tenant must be a name of 1-64 letters, digits, '.', '_' or '-', got "
            f"{_short(tenant)}"
        )
    if tenant == "anonymous":
        raise SpecError("[body].tenant 'anonymous' is the tenant of requests without a key")
    names = class_names(config)
    priority = _class(body, "priority", names) or default_class(config)
    default = _class(body, "default_priority", names) or priority
    if names.index(default) < names.index(priority):
        raise SpecError(
            f"[body].default_priority {default!r} ranks above [body].priority {priority!r}"
        )
    limits = {name: _limit(body.get(name), name) for name in LIMITS}
    expires = _expires(body.get("expires"), now)
    return KeySpec(tenant, priority, default, **limits, expires=expires)


def _class(body: dict[str, Any], field: str, names: tuple[str, ...]) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or value.strip().lower() not in names:
        raise SpecError(f"[body].{field} must be one of {list(names)}, got {_short(value)}")
    return value.strip().lower()


def _limit(value: object, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise SpecError(
            f"[body].{field} must be a positive integer or null (unlimited), got {_short(value)}"
        )
    return value


def _expires(value: object, now: float) -> float | None:
    if value is None:
        return None
    when: float
    if isinstance(value, int | float) and not isinstance(value, bool):
        when = float(value)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            raise SpecError(
                "[body].expires must be Unix seconds or an RFC 3339 time with its offset, got "
                f"{_short(value)}"
            )
        when = parsed.timestamp()
    else:
        raise SpecError(
            f"[body].expires must be Unix seconds or an RFC 3339 time, got {_short(value)}"
        )
    if not when > now:
        raise SpecError(f"[body].expires is in the past: {_short(value)}")
    return when


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

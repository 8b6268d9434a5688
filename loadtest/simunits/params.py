"""Validation of control API bodies for the simulated units test tool.

A test that mistypes a fault parameter must fail loudly at the control call, naming the
field, rather than silently running against a unit that is not faulted the way it thinks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from loadtest.simunits.state import (
    Fault,
    FaultMode,
    HealthMode,
    NodeHealth,
    Settings,
    ToolsMode,
)


class ParamError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


_AT_RATE = frozenset({"rate", "seed"})
_FAULT_PARAMS: dict[FaultMode, frozenset[str]] = {
    FaultMode.NONE: frozenset(),
    FaultMode.ERROR: frozenset({"status"}) | _AT_RATE,
    # A refused connection is a property of the socket, not of a request: no rate.
    FaultMode.REFUSE: frozenset(),
    FaultMode.HANG: _AT_RATE,
    FaultMode.STALL: frozenset({"after_tokens"}) | _AT_RATE,
    FaultMode.DROP: frozenset({"after_tokens"}) | _AT_RATE,
}

_FAULT_MODES = frozenset(m.value for m in FaultMode)
_HEALTH_MODES = frozenset(m.value for m in HealthMode)
_TOOLS_MODES = frozenset(m.value for m in ToolsMode)
_SETTINGS = frozenset({"ttft_ms", "itl_ms", "tokens", "tools", "variant", "stall_rate", "stall_ms"})
DEFAULT_SLOW_DELAY_MS = 1000.0


def as_object(body: object) -> Mapping[str, object]:
    if not isinstance(body, Mapping):
        raise ParamError("body", "must be a JSON object")
    return body


def number(body: Mapping[str, object], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ParamError(key, "must be a number >= 0")
    return float(value)


def integer(body: Mapping[str, object], key: str, default: int, minimum: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParamError(key, f"must be an integer >= {minimum}")
    return value


def _rate(body: Mapping[str, object]) -> float | None:
    value = body.get("rate")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ParamError("rate", "must be a number in (0, 1]")
    return float(value)


def _seed(body: Mapping[str, object]) -> int | None:
    value = body.get("seed")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamError("seed", "must be an integer")
    return value


def _reject_unknown(body: Mapping[str, object], allowed: frozenset[str], what: str) -> None:
    for key in body:
        if key not in allowed:
            raise ParamError(key, f"is not a parameter of {what}")


def _tools_mode(body: Mapping[str, object], default: ToolsMode) -> ToolsMode:
    value = body.get("tools", default.value)
    if not isinstance(value, str) or value not in _TOOLS_MODES:
        raise ParamError("tools", f"must be one of {', '.join(ToolsMode)}")
    return ToolsMode(value)


def _variant(body: Mapping[str, object], default: str) -> str:
    value = body.get("variant", default)
    if not isinstance(value, str):
        raise ParamError("variant", "must be a string")
    return value


def parse_settings(raw: object, current: Settings) -> Settings:
    body = as_object(raw)
    _reject_unknown(body, _SETTINGS, "settings")
    return dataclasses.replace(
        current,
        ttft_ms=number(body, "ttft_ms", current.ttft_ms),
        itl_ms=number(body, "itl_ms", current.itl_ms),
        tokens=integer(body, "tokens", current.tokens, 1),
        tools=_tools_mode(body, current.tools),
        variant=_variant(body, current.variant),
        stall_rate=_share(body, "stall_rate", current.stall_rate),
        stall_ms=number(body, "stall_ms", current.stall_ms),
    )


def _share(body: Mapping[str, object], key: str, default: float) -> float:
    value = number(body, key, default)
    if value > 1:
        raise ParamError(key, "must be a share in [0, 1]")
    return value


def _fault_mode(body: Mapping[str, object]) -> FaultMode:
    value = body.get("mode")
    if not isinstance(value, str) or value not in _FAULT_MODES:
        raise ParamError("mode", f"must be one of {', '.join(FaultMode)}")
    return FaultMode(value)


def _health_mode(body: Mapping[str, object]) -> HealthMode:
    value = body.get("mode")
    if not isinstance(value, str) or value not in _HEALTH_MODES:
        raise ParamError("mode", f"must be one of {', '.join(HealthMode)}")
    return HealthMode(value)


def parse_fault(raw: object) -> Fault:
    body = as_object(raw)
    mode = _fault_mode(body)
    allowed = _FAULT_PARAMS[mode] | {"mode", "count"}
    _reject_unknown(body, allowed, f"fault mode {mode.value!r}")
    count = body.get("count")
    if count is not None:
        if mode is FaultMode.REFUSE:
            raise ParamError("count", "is not supported with mode 'refuse'; clear it with 'none'")
        count = integer(body, "count", 1, 1)
    rate, seed = _rate(body), _seed(body)
    if rate is not None and count is not None:
        raise ParamError("rate", "cannot be combined with 'count'; give one of them")
    if seed is not None and rate is None:
        raise ParamError("seed", "only applies to a fault with a 'rate'")
    status = integer(body, "status", 500, 400)
    if status > 599:
        raise ParamError("status", "must be an HTTP error status (400-599)")
    return Fault(mode, count, status, integer(body, "after_tokens", 2, 0), rate, seed)


def parse_node_health(raw: object) -> NodeHealth:
    body = as_object(raw)
    mode = _health_mode(body)
    allowed = frozenset({"mode", "delay_ms"} if mode is HealthMode.SLOW else {"mode"})
    _reject_unknown(body, allowed, f"health mode {mode.value!r}")
    if mode is not HealthMode.SLOW:
        return NodeHealth(mode)
    return NodeHealth(mode, number(body, "delay_ms", DEFAULT_SLOW_DELAY_MS))

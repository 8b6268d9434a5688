"""Builds frozen dataclasses from TOML tables, checking types against the annotations.

Unknown keys are errors: a misspelt setting that is silently ignored is worse than a refusal
to start.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from gateway.config.checks import ConfigError, FieldError


def build(cls: type[Any], table: Any, where: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{where or 'top level'} must be a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {_key(where, unknown[0])}; known keys: {sorted(fields)}")
    kwargs = {
        name: _convert(hints[name], value, _key(where, name)) for name, value in table.items()
    }
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required key {_key(where, missing[0])}")
    try:
        return cls(**kwargs)
    except FieldError as exc:
        raise ConfigError(f"{_key(where, exc.name)} {exc.problem}, got {exc.value!r}") from None


def table(value: Any) -> dict[str, Any]:
    """A built dataclass as the table `build` reads back: None fields left out, tuples as
    lists (what crosses a process boundary or a store as JSON)."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise TypeError(f"table: expected a dataclass instance, got {type(value).__name__}")
    out: dict[str, Any] = _plain(dataclasses.asdict(value))
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        for option in options[:-1]:  # int | str: whichever type the value has
            try:
                return _convert(option, value, key)
            except ConfigError:
                continue
        return _convert(options[-1], value, key)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        if dataclasses.is_dataclass(item):
            return tuple(build(item, v, f"{key}[{i}]") for i, v in enumerate(value))  # type: ignore[arg-type]
        return tuple(_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:  # a free-form table (a unit's engine_args), passed on as it is
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key)  # type: ignore[arg-type]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{key} must be of type {hint.__name__}, got {value!r}")
    return value


def _key(where: str, name: str) -> str:
    if not where:
        return f"[{name}]"
    return f"{where}.{name}" if where.endswith("]") else f"[{where}].{name}"

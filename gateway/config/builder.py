"""Builds frozen dataclasses from TOML tables, checking types against the annotations.

Unknown keys are errors: a misspelt setting that is silently ignored is worse than a refusal
to start.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from gateway.config.checks import ConfigError, FieldError, collecting


def build(cls: type[Any], table: Any, where: str) -> Any:
    """`cls` from `table`, or one ConfigError listing every problem found: unknown, missing
    and mistyped keys across all sections, and the range rules of each section (run with the
    keys that converted, defaults standing in for plain keys that did not)."""
    if not isinstance(table, dict):
        raise ConfigError(
            f"{where or 'top level'} must be a table, got {type(table).__name__}", where
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    errors = [
        ConfigError(
            f"unknown key {key_name(where, name)}; known keys: {sorted(fields)}",
            key_name(where, name),
        )
        for name in sorted(set(table) - set(fields))
    ]
    kwargs, failed = {}, set()
    for name, value in table.items():
        if name in fields:
            try:
                kwargs[name] = _convert(hints[name], value, key_name(where, name))
            except ConfigError as exc:
                errors.append(exc)
                failed.add(name)
    errors += [
        ConfigError(f"missing required key {key_name(where, n)}", key_name(where, n))
        for n, f in fields.items()
        if n not in table and not _has_default(f)
    ]
    if errors and not _rules_can_run(fields, hints, failed, table):
        raise ConfigError.of(errors)
    built, broken = _construct(cls, kwargs, where, failed)
    errors += broken
    if errors:
        raise ConfigError.of(errors)
    return built


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _rules_can_run(
    fields: dict[str, dataclasses.Field[Any]],
    hints: dict[str, Any],
    failed: set[str],
    table: dict[str, Any],
) -> bool:
    """Whether the section's own rules can still be run to report more: every required key
    is there, and each key that failed is a plain value its default may stand in for (not a
    table, whose default would make rules comparing sections report errors nobody made)."""
    required = all(n in table for n, f in fields.items() if not _has_default(f))
    plain = all(_has_default(fields[n]) and not _holds_tables(hints[n]) for n in failed)
    return required and plain


def _holds_tables(hint: Any) -> bool:
    if dataclasses.is_dataclass(hint):
        return True
    return any(_holds_tables(arg) for arg in typing.get_args(hint))


def _construct(
    cls: type[Any], kwargs: dict[str, Any], where: str, stand_ins: set[str]
) -> tuple[Any, list[ConfigError]]:
    """Run the section's own rules: the built section, and every rule that failed (but
    those on keys whose default stands in for a value already reported)."""
    built = None
    with collecting() as failed:
        try:
            built = cls(**kwargs)
        except FieldError as exc:  # raised directly rather than through `check`
            failed.append(exc)
        except Exception:
            if not failed and not stand_ins:
                raise
            # A rule after a failed one tripped over the bad value: report what was found.
    errors = [
        ConfigError(
            f"{key_name(where, e.name)} {e.problem}, got {e.value!r}", key_name(where, e.name)
        )
        for e in failed
        if e.name not in stand_ins
    ]
    return built, errors


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
            raise ConfigError(f"{key} must be a list, got {value!r}", key)
        return _items(item, value, key)
    if origin is dict:  # a free-form table (a unit's engine_args), passed on as it is
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {value!r}", key)
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key)  # type: ignore[arg-type]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{key} must be of type {hint.__name__}, got {value!r}", key)
    return value


def _items(item: Any, values: list[Any], key: str) -> tuple[Any, ...]:
    """A list's items, each checked; the errors of all of them at once."""
    out, errors = [], []
    for i, value in enumerate(values):
        try:
            if dataclasses.is_dataclass(item):
                out.append(build(item, value, f"{key}[{i}]"))  # type: ignore[arg-type]
            else:
                out.append(_convert(item, value, f"{key}[{i}]"))
        except ConfigError as exc:
            errors.append(exc)
    if errors:
        raise ConfigError.of(errors)
    return tuple(out)


def key_name(where: str, name: str) -> str:
    if not where:
        return f"[{name}]"
    bracketed = where.endswith("]") or where.startswith("[")  # a table in a section
    return f"{where}.{name}" if bracketed else f"[{where}].{name}"

"""Environment overrides: any config key set by a variable, checked like the file.

`UNITGATE__<SECTION>__<KEY>=<value>` sets `[section].key`; a unit's key is reached by its index
in `[[units]]`: `UNITGATE__UNITS__0__LEADER=http://10.0.0.5:8000`. The double underscore
separates the parts (keys hold single ones), and no other variable of the project starts with
`UNITGATE__`. The value is read as a TOML value (`600`, `true`, `["a", "b"]`, `{k = "v"}`); a
key that takes text also takes the bare text, so URLs and names need no quotes. The result is
merged into the file's tables before they are built, so the builder checks types and ranges
exactly as it checks the file, and an error a variable caused names the variable.

An index one past the file's last unit adds a unit (all its required keys must then be set);
a whole section, unit or list may be replaced at once (`UNITGATE__UNITS__1='{id = "u1", ...}'`),
and deeper variables then apply on top of it.
"""

from __future__ import annotations

import copy
import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config.builder import key_name
from gateway.config.checks import ConfigError

PREFIX = "UNITGATE__"
SEPARATOR = "__"

Part = str | int


@dataclass(frozen=True, slots=True)
class Override:
    var: str  # the variable's name
    path: tuple[Part, ...]  # ("timeouts", "total") or ("units", 0, "leader")
    key: str  # as errors name it: [timeouts].total, [units][0].leader
    value: Any


def overrides(
    cls: type[Any], environ: Mapping[str, str]
) -> tuple[list[Override], list[ConfigError]]:
    """Every `UNITGATE__` variable resolved against `cls`'s fields, in the order they apply
    (whole tables before their keys, units by index); and one error per variable that names
    no key."""
    found, errors = [], []
    for var in sorted(v for v in environ if v.startswith(PREFIX)):
        try:
            found.append(_resolve(cls, var, environ[var]))
        except ConfigError as exc:
            errors.append(exc)
    found.sort(key=_order)
    return found, errors


def _order(override: Override) -> list[tuple[int, str]]:
    """A table before the keys inside it, list entries by index (so new ones append)."""
    return [(0, f"{p:09d}") if isinstance(p, int) else (1, p) for p in override.path]


def apply(raw: dict[str, Any], found: list[Override]) -> tuple[dict[str, Any], list[ConfigError]]:
    """The file's tables with the overrides merged in (the file's dict is not changed)."""
    merged = copy.deepcopy(raw)
    errors = []
    for override in found:
        try:
            _set(merged, override)
        except ConfigError as exc:
            errors.append(exc)
    return merged, errors


def overlay(cls: type[Any], raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The file's tables as the gateway sees them, for a tool that reads them without building
    a config (the simulated units read `[[units]]`); ConfigError if a variable names no key."""
    found, errors = overrides(cls, environ)
    merged, unplaced = apply(raw, found)
    if errors or unplaced:
        raise ConfigError.of(errors + unplaced)
    return merged


def annotate(error: ConfigError, found: list[Override]) -> ConfigError:
    """`error` with each message an override caused naming its variable."""

    def named(leaf: ConfigError) -> str:
        covering = [o for o in found if _under(leaf.key, o.key)]
        if not covering:
            return str(leaf)
        return f"{leaf} (from {max(covering, key=lambda o: len(o.key)).var})"

    return error.mapped(named)


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith((f"{prefix}.", f"{prefix}["))


def _resolve(cls: type[Any], var: str, text: str) -> Override:
    names = var[len(PREFIX) :].split(SEPARATOR)
    if not all(names):
        raise ConfigError(f"{var}: empty part in the name (parts are separated by {SEPARATOR!r})")
    hint: Any = cls
    path: list[Part] = []
    where = ""
    for name in names:
        if hint is not None and dataclasses.is_dataclass(hint):
            fields = typing.get_type_hints(hint)
            lowered = name.lower()
            if lowered not in fields:
                key = key_name(where, lowered)
                raise ConfigError(f"{var}: unknown key {key}; known keys: {sorted(fields)}", key)
            path.append(lowered)
            where, hint = key_name(where, lowered), _optional(fields[lowered])
        elif typing.get_origin(hint) is tuple:
            if not name.isdigit():
                raise ConfigError(f"{var}: {where} is a list: {name!r} must be an index", where)
            path.append(int(name))
            where, hint = f"{where}[{int(name)}]", typing.get_args(hint)[0]
        else:
            raise ConfigError(
                f"{var}: {where} is one value: set it whole, nothing inside it ({name!r})", where
            )
    return Override(var, tuple(path), where, _parse(text, hint))


def _optional(hint: Any) -> Any:
    """`X | None` is X here: a variable cannot set None (leave it unset instead)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return options[0] if len(options) == 1 else hint
    return hint


def _parse(text: str, hint: Any) -> Any:
    """A TOML value; for a key that takes only text, the text itself unless it is a quoted
    TOML string (so `http://host:8000`, `true` or `0123` stay text there)."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if hint is str and not isinstance(value, str):
        return text
    return value


def _set(merged: dict[str, Any], override: Override) -> None:
    container: Any = merged
    where = ""
    *steps, last = override.path
    for step, following in zip(steps, override.path[1:], strict=True):
        empty: Any = [] if isinstance(following, int) else {}
        container, where = _step(container, step, empty, where, override)
    if isinstance(last, int):
        _place(container, last, override.value, where, override)
    else:
        container[last] = override.value


def _step(container: Any, step: Part, empty: Any, where: str, override: Override) -> Any:
    """One level down from `container`, made when absent."""
    if isinstance(step, int):
        _place(container, step, empty, where, override, keep=True)
        inner, where = container[step], f"{where}[{step}]"
    else:
        inner = container.setdefault(step, empty)
        where = key_name(where, step)
    if not isinstance(inner, type(empty)):
        kind = "list" if isinstance(empty, list) else "table"
        raise ConfigError(
            f"{override.var}: cannot set {override.key}: {where} is not a {kind}, got {inner!r}",
            override.key,
        )
    return inner, where


def _place(
    items: Any, index: int, value: Any, where: str, override: Override, keep: bool = False
) -> None:
    """Put `value` at `index` of the list, one past its end included (a new entry)."""
    if not isinstance(items, list):
        raise ConfigError(
            f"{override.var}: cannot set {override.key}: {where} is not a list, got {items!r}",
            override.key,
        )
    if index < len(items):
        if not keep:
            items[index] = value
        return
    if index > len(items):
        raise ConfigError(
            f"{override.var}: {where} has {len(items)} entries, so a new one takes index "
            f"{len(items)}, got {index}",
            override.key,
        )
    items.append(value)

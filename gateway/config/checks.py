"""Validation helpers shared by the config sections: errors that name the key and the value.

A section's `__post_init__` calls `check` for each rule. Called directly, the first failed rule
raises; while the builder `collects` (it builds a whole file), every failed rule is recorded and
the builder reports them all at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range.

    `key` names the setting (``[timeouts].total``; "" when none applies). One ConfigError may
    carry several: `errors` then lists each (a single error lists itself) and `str()` is their
    messages, one per line.
    """

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.errors: tuple[ConfigError, ...] = (self,)

    @classmethod
    def of(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error standing for all of `errors` (each flattened; repeats dropped)."""
        seen: dict[tuple[str, str], ConfigError] = {}
        for leaf in (leaf for e in errors for leaf in e.errors):
            seen.setdefault((str(leaf), leaf.key), leaf)
        leaves = list(seen.values())
        if len(leaves) == 1:
            return leaves[0]
        combined = cls("\n".join(str(e) for e in leaves))
        combined.errors = tuple(leaves)
        return combined

    def messages(self) -> list[str]:
        return [str(e) for e in self.errors]

    def mapped(self, change: Callable[[ConfigError], str]) -> ConfigError:
        """The same errors, each message rewritten by `change` (a file name put in front)."""
        return ConfigError.of([ConfigError(change(e), e.key) for e in self.errors])


class FieldError(Exception):
    """Raised by a section's __post_init__; the builder turns it into a ConfigError with the key."""

    def __init__(self, name: str, value: Any, problem: str) -> None:
        super().__init__(name)
        self.name, self.value, self.problem = name, value, problem


_collected: contextvars.ContextVar[list[FieldError] | None] = contextvars.ContextVar(
    "config_collected", default=None
)


@contextlib.contextmanager
def collecting() -> Iterator[list[FieldError]]:
    """While inside, `check` records failed rules in the list instead of raising."""
    found: list[FieldError] = []
    token = _collected.set(found)
    try:
        yield found
    finally:
        _collected.reset(token)


def check(ok: bool, name: str, value: Any, problem: str) -> None:
    if ok:
        return
    error = FieldError(name, value, problem)
    found = _collected.get()
    if found is None:
        raise error
    found.append(error)


def positive(name: str, value: float) -> None:
    check(value > 0 and math.isfinite(value), name, value, "must be a positive number")


def base_url(name: str, url: str) -> None:
    parts = urlsplit(url)
    ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/")
    check(ok, name, url, "must be a base URL like http://host:port")


def installed(key: str, value: Any, modules: Sequence[str], extra: str) -> None:
    """`key` needs `modules`, which the package's `extra` installs."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    check(
        not missing, key, value, f"needs {' and '.join(missing)}: pip install 'unitgate[{extra}]'"
    )

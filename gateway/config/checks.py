"""Validation helpers shared by the config sections: errors that name the key and the value."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class FieldError(Exception):
    """Raised by a section's __post_init__; the builder turns it into a ConfigError with the key."""

    def __init__(self, name: str, value: Any, problem: str) -> None:
        super().__init__(name)
        self.name, self.value, self.problem = name, value, problem


def check(ok: bool, name: str, value: Any, problem: str) -> None:
    if not ok:
        raise FieldError(name, value, problem)


def positive(name: str, value: float) -> None:
    check(value > 0 and math.isfinite(value), name, value, "must be a positive number")


def base_url(name: str, url: str) -> None:
    parts = urlsplit(url)
    ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/")
    check(ok, name, url, "must be a base URL like http://host:port")

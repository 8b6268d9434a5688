"""The version of unitgate that is running: the installed package's, else pyproject.toml's."""

from __future__ import annotations

import functools
import importlib.metadata
import tomllib
from pathlib import Path

_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@functools.cache
def version() -> str:
    """E.g. "0.1.0"; "unknown" when neither the package metadata nor a source tree says."""
    try:
        return importlib.metadata.version("unitgate")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        found = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8"))["project"]["version"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return "unknown"
    return str(found)

"""docs/configuration.md documents every configuration key, and only keys that exist.

The keys come from the configuration classes themselves (`gateway.config.Config` and the
dataclasses it nests, the per-unit `[[units]]` table included), so a key added to the code
without a line in the reference fails here, naming it as `[section].key`. The page's
convention, stated at its top: a key is documented by a table row whose first cell is the key
in backticks, under the heading that names its section in backticks.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.config import Config

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
# "## `[gateway]`", "## `[[units]]`", "### `[gateway.tls]`", "### `[rollout.hooks.NAME]`": the
# section a table belongs to.
HEADING = re.compile(r"^#{1,6}\s+`(\[\[?[A-Za-z0-9_.]+\]\]?)`\s*$")
OTHER_HEADING = re.compile(r"^#{1,6}\s")
ROW = re.compile(r"^\|\s*`([A-Za-z0-9_]+)`\s*\|")


def config_keys() -> set[str]:
    """Every key a config file may hold, as `[section].key` or `[[units]].key`."""
    keys: set[str] = set()
    for field in dataclasses.fields(Config):
        section, nested = _section_of(typing.get_type_hints(Config)[field.name], field.name)
        assert nested is not None, f"top-level key {field.name!r} is not a table"
        keys.update(_walk(nested, section))
    return keys


def _walk(cls: type[Any], section: str) -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        inner = section.strip("[]")
        sub, nested = _section_of(hints[field.name], f"{inner}.{field.name}")
        if nested is None:
            yield f"{section}.{field.name}"
        else:
            yield from _walk(nested, sub)


def _section_of(hint: Any, name: str) -> tuple[str, type[Any] | None]:
    """(`[name]` or `[[name]]`, the dataclass) when `hint` is a table, else (name, None)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            hint = options[0]
    if dataclasses.is_dataclass(hint):
        return f"[{name}]", typing.cast(type[Any], hint)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(item):
            return f"[[{name}]]", typing.cast(type[Any], item)
    if typing.get_origin(hint) is dict:  # named tables of one kind: [rollout.hooks.NAME]
        item = typing.get_args(hint)[1]
        if dataclasses.is_dataclass(item):
            return f"[{name}.NAME]", typing.cast(type[Any], item)
    return name, None


def documented_keys(markdown: str) -> set[str]:
    """`[section].key` for every table row naming a key under a section's heading."""
    keys: set[str] = set()
    section = ""
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = HEADING.match(line)
        if heading:
            section = heading[1]
        elif OTHER_HEADING.match(line):
            section = ""
        elif section and (row := ROW.match(line)):
            keys.add(f"{section}.{row[1]}")
    return keys


def test_every_config_key_is_documented() -> None:
    missing = sorted(config_keys() - documented_keys(PAGE.read_text(encoding="utf-8")))
    assert not missing, (
        f"{len(missing)} config keys are not documented in docs/configuration.md "
        f"(a table row `| `key` | ...` under the heading `## `[section]``): {', '.join(missing)}"
    )


def test_every_documented_key_exists() -> None:
    stale = sorted(documented_keys(PAGE.read_text(encoding="utf-8")) - config_keys())
    assert not stale, f"docs/configuration.md documents keys the config has not: {stale}"


def test_the_walk_reaches_every_section_and_the_units_table() -> None:
    keys = config_keys()
    for expected in ("[gateway].port", "[timeouts].idle", "[state].url", "[[units]].leader"):
        assert expected in keys
    assert "[[units]].engine_args" in keys  # a free-form table is one key, not a section
    assert "[rollout.hooks.NAME].command" in keys  # named tables: one section for them all
    assert len(keys) > 80


def test_a_row_removed_from_the_page_is_reported() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for key, row in (("[timeouts].idle", "| `idle` |"), ("[[units]].weight", "| `weight` |")):
        assert row in page
        cut = "\n".join(line for line in page.splitlines() if not line.startswith(row))
        assert key in config_keys() - documented_keys(cut)
    # A row under another section's heading does not document the key.
    moved = page.replace("## `[timeouts]`", "## `[timeouts_elsewhere]`")
    assert "[timeouts].connect" in config_keys() - documented_keys(moved)

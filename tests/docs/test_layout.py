"""development.md's layout names every package of the gateway and the engine, so that a new
package cannot land without saying where it stands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "development.md"


def layout_names() -> set[str]:
    """The `  name/` entries of the Layout block, under their top-level folder."""
    text = PAGE.read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    names, top = set(), ""
    for line in block.splitlines():
        head = re.match(r"^(\S+)/\s", line)
        if head:
            top = head.group(1)
            continue
        entry = re.match(r"^  (\S+?)/?\s", line)
        if entry and top:
            names.add(f"{top}/{entry.group(1)}")
    return names


def packages() -> set[str]:
    return {
        f"{top}/{init.parent.name}"
        for top in ("gateway", "engine")
        for init in (ROOT / top).glob("*/__init__.py")
    }


def test_development_md_names_every_package_of_the_gateway_and_the_engine() -> None:
    missing = packages() - layout_names()
    assert missing == set(), f"docs/development.md's Layout does not name {sorted(missing)}"


def test_the_check_reads_the_layout_block() -> None:
    names = layout_names()
    assert {"gateway/proxy", "gateway/base", "engine/model"} <= names
    assert "gateway/no_such_package" not in names

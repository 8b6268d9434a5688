"""Helpers for running one unit across simulator processes: free ports and a units TOML.

Shared with the gateway's health tests, which kill or freeze a single follower process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.base.ports import free_port
from tests.support import SimProcess, start_sim


def planned_units(nodes: Sequence[int]) -> list[dict[str, Any]]:
    """Units `u0`, `u1`, ... with `nodes[i]` nodes each, on free loopback ports."""
    units = []
    for i, count in enumerate(nodes):
        urls = [f"http://127.0.0.1:{free_port()}" for _ in range(count)]
        units.append({"id": f"u{i}", "leader": urls[0], "nodes": urls})
    return units


def units_toml(units: Sequence[Mapping[str, Any]]) -> str:
    tables = []
    for unit in units:
        nodes = ", ".join(f'"{url}"' for url in unit["nodes"])
        tables.append(
            f'[[units]]\nid = "{unit["id"]}"\nleader = "{unit["leader"]}"\nnodes = [{nodes}]\n'
        )
    return "\n".join(tables)


def start_part(tmp: Path, name: str, config: Path, nodes: str, *args: str) -> SimProcess:
    """A simulator process serving only `nodes` (`unit:rank,...`) of the units in `config`."""
    where = tmp / name
    where.mkdir()
    return start_sim(where, "--from-config", str(config), "--nodes", nodes, *args)

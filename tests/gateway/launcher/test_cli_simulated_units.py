"""`unitgate up --simulated` hands the simulator the units as the gateway loaded them, so an
environment override of a unit's address moves the simulated unit too."""

from __future__ import annotations

import tomllib
from pathlib import Path

from gateway.config import load_config
from gateway.launcher.cli import _units_toml
from loadtest.simunits.topology import units_from_config

FILE = """
[gateway]
models = ["m"]

[[units]]
id = "u0"
leader = "http://127.0.0.1:8100"
nodes = ["http://127.0.0.1:8102", "http://127.0.0.1:8103"]

[[units]]
id = "u1"
leader = "http://127.0.0.1:8200"
"""


def test_the_simulator_reads_the_units_with_their_overrides(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(FILE, encoding="utf-8")
    environ = {
        "UNITGATE__UNITS__1__LEADER": "http://127.0.0.1:9200",
        "UNITGATE__UNITS__2": '{id = "u2", leader = "http://127.0.0.1:9300"}',
    }
    config = load_config(path, environ)
    specs = units_from_config(tomllib.loads(_units_toml(config)))
    assert [(s.id, s.leader.url(), [n.url() for n in s.nodes]) for s in specs] == [
        ("u0", "http://127.0.0.1:8100", ["http://127.0.0.1:8102", "http://127.0.0.1:8103"]),
        ("u1", "http://127.0.0.1:9200", ["http://127.0.0.1:9200"]),
        ("u2", "http://127.0.0.1:9300", ["http://127.0.0.1:9300"]),
    ]

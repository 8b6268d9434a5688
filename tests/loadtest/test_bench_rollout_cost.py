"""The rollout cost benchmark's gateway: two cells, each serving v1 with a v2 unit waiting."""

from __future__ import annotations

import tomllib

from gateway.config import config_from_dict
from gateway.units import UnitRegistry
from loadtest.bench.rollout_cost import config


def test_its_config_puts_a_waiting_new_unit_in_each_cell() -> None:
    units = [
        {
            "id": f"u{i}",
            "leader": f"http://127.0.0.1:{9000 + i}",
            "nodes": [f"http://127.0.0.1:{9000 + i}"],
        }
        for i in range(4)
    ]
    registry = UnitRegistry(config_from_dict(tomllib.loads(config(units))))
    assert dict(registry.revisions.serving) == {"a": "v1", "b": "v1"}
    assert {u.id for u in registry.units.values() if u.why_idle} == {"u1", "u3"}

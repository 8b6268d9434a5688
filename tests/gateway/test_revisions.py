"""Cells and revisions in the routing snapshot: one revision per cell outside a rollout, a
rollout's split of one cell by each conversation's draw, and weights that keep a cell's share."""

from __future__ import annotations

from random import Random
from typing import Any

import pytest

from gateway.config import ConfigError, config_from_dict
from gateway.config.unit import UnitConfig
from gateway.health_states import Health
from gateway.revisions import Canary, Revisions, draw, from_wire, to_wire
from gateway.units import UnitRegistry

# Two cells of two old units each, and one new unit in each cell.
UNITS = [
    ("a1", "a", "v1"),
    ("a2", "a", "v1"),
    ("b1", "b", "v1"),
    ("b2", "b", "v1"),
]


def registry(units: list[tuple[str, str, str]] = UNITS, **extra: Any) -> UnitRegistry:
    tables = [
        {"id": i, "leader": f"http://127.0.0.1:{9000 + n}", "cell": c, "revision": r, **extra}
        for n, (i, c, r) in enumerate(units)
    ]
    config = config_from_dict({"gateway": {"models": ["m"]}, "units": tables})
    reg = UnitRegistry(config)
    for unit_id in reg.units:
        reg.set_health(unit_id, Health.HEALTHY, "ok")
    return reg


def add(reg: UnitRegistry, unit_id: str, cell: str, revision: str, weight: float = 1.0) -> None:
    port = 9100 + len(reg.units)
    reg.add(
        UnitConfig(unit_id, f"http://127.0.0.1:{port}", cell=cell, revision=revision, weight=weight)
    )
    reg.set_health(unit_id, Health.HEALTHY, "ok")


def ids(reg: UnitRegistry, moving: bool = False) -> list[str]:
    return sorted(u.id for u in reg.routable("m", moving))


def test_a_unit_of_another_revision_gets_no_traffic_and_says_why() -> None:
    reg = registry()
    add(reg, "a3", "a", "v2")
    assert ids(reg) == ["a1", "a2", "b1", "b2"]
    idle = reg.units["a3"]
    assert idle.routable and not idle.serving
    assert "cell 'a' serves 'v1'" in idle.why_idle and "rollout" in idle.why_idle
    assert reg.units["a1"].why_idle == ""


def test_the_first_unit_of_a_new_cell_sets_its_revision() -> None:
    reg = registry()
    add(reg, "c1", "c", "v7")
    add(reg, "c2", "c", "v8")
    assert reg.revisions.of("c") == "v7"
    assert "c1" in ids(reg) and "c2" not in ids(reg)


def test_a_cells_first_configured_unit_sets_its_revision() -> None:
    reg = registry([("a1", "a", "v1"), ("a2", "a", "v2"), ("b1", "b", "v2")])
    assert dict(reg.revisions.serving) == {"a": "v1", "b": "v2"}
    assert ids(reg) == ["a1", "b1"] and "cell 'a' serves 'v1'" in reg.units["a2"].why_idle


def test_cell_and_revision_are_checked() -> None:
    for key, value in (("cell", "has space"), ("cell", ""), ("revision", "tab\there")):
        raw = {
            "gateway": {"models": ["m"]},
            "units": [{"id": "x", "leader": "http://127.0.0.1:1", key: value}],
        }
        with pytest.raises(ConfigError) as err:
            config_from_dict(raw)
        assert key in str(err.value) and repr(value) in str(err.value)
    assert UnitConfig("x", "http://127.0.0.1:1").cell == "default"


def test_a_rollout_splits_only_the_cell_it_moves() -> None:
    reg = registry()
    add(reg, "a3", "a", "v2")
    add(reg, "b3", "b", "v2")
    canary = Canary("r1", "v1", "v2", frozenset({"a", "b"}), cell="a", share=0.25)
    reg.set_revisions(Revisions(reg.revisions.serving, canary))
    # Drawn below the share: cell a's new unit instead of its old ones; cell b unchanged.
    assert ids(reg, moving=True) == ["a3", "b1", "b2"]
    assert ids(reg, moving=False) == ["a1", "a2", "b1", "b2"]
    assert reg.units["a3"].why_idle == "" and "not moved cell 'b'" in reg.units["b3"].why_idle
    # Cell a moved; cell b being moved.
    canary = Canary("r1", "v1", "v2", frozenset({"a", "b"}), frozenset({"a"}), "b", 0.5)
    reg.set_revisions(Revisions(reg.revisions.serving, canary))
    assert ids(reg, moving=False) == ["a3", "b1", "b2"]
    assert ids(reg, moving=True) == ["a3", "b3"]
    # Rolled back: the canary removed, every cell on its serving revision again.
    reg.set_revisions(Revisions(reg.revisions.serving))
    assert ids(reg) == ids(reg, moving=True) == ["a1", "a2", "b1", "b2"]
    assert reg.moving is reg.snapshot


def test_new_units_weigh_what_the_cells_old_units_weigh_while_the_rollout_runs() -> None:
    reg = registry()
    add(reg, "a3", "a", "v2")  # one new unit against two old ones (weight 1 each)
    canary = Canary("r1", "v1", "v2", frozenset({"a", "b"}), cell="a", share=0.05)
    reg.set_revisions(Revisions(reg.revisions.serving, canary))
    assert reg.units["a3"].weight == 2.0 and reg.units["a1"].weight == 1.0
    reg.set_health("a3", Health.SLOW, "probes time out")
    assert reg.units["a3"].weight == pytest.approx(2.0 * reg._slow_weight)
    reg.set_revisions(Revisions(reg.revisions.serving))  # ended: configured weights again
    assert reg.units["a3"].scale == 1.0
    assert reg.units["a3"].weight == pytest.approx(reg._slow_weight)


def test_changes_reach_listeners_once() -> None:
    reg = registry()
    seen: list[Revisions] = []
    reg.on_revisions(seen.append)
    revisions = Revisions(reg.revisions.serving, Canary("r", "v1", "v2", frozenset({"a"})))
    reg.set_revisions(revisions)
    reg.set_revisions(revisions)
    assert seen == [revisions]


def test_revisions_round_trip_as_json() -> None:
    reg = registry()
    canary = Canary("r9", "v1", "v2", frozenset({"a", "b"}), frozenset({"a"}), "b", 0.25, False)
    revisions = Revisions(reg.revisions.serving, canary)
    assert from_wire(to_wire(revisions)) == revisions
    assert from_wire(to_wire(Revisions(reg.revisions.serving))).canary is None


def test_a_conversation_keeps_its_draw_and_rollouts_split_differently() -> None:
    rng = Random(1)
    assert draw("r1", "s", rng) == draw("r1", "s", rng)
    assert draw("r1", "s", rng) != draw("r2", "s", rng)
    draws = [draw("r1", f"session-{i}", rng) for i in range(4000)]
    assert all(0 <= d < 1 for d in draws)
    assert 0.22 < sum(d < 0.25 for d in draws) / len(draws) < 0.28
    anonymous = [draw("r1", None, rng) for _ in range(1000)]
    assert len(set(anonymous)) == 1000

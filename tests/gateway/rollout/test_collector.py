"""A rollout's windows: kept per split (rollout, epoch, cell), carried from step to step
within a cell, and summed over workers for the split the control plane routes by."""

from __future__ import annotations

from gateway.config import config_from_dict
from gateway.revisions import Canary, Revisions
from gateway.rollout.collector import Collector, key_of
from gateway.units import UnitRegistry
from gateway.workers.rollout_samples import FleetSamples


def registry() -> UnitRegistry:
    units = [
        {"id": i, "leader": f"http://127.0.0.1:{9000 + n}", "cell": "a", "revision": r}
        for n, (i, r) in enumerate([("old", "v1"), ("new", "v2")])
    ]
    return UnitRegistry(config_from_dict({"gateway": {"models": ["m"]}, "units": units}))


def split(reg: UnitRegistry, epoch: int, moved: frozenset[str] = frozenset()) -> None:
    canary = Canary("r1", "v1", "v2", frozenset({"a", "b"}), moved, "a", 0.5, epoch=epoch)
    reg.set_revisions(Revisions(reg.revisions.serving, canary))


def answer(collector: Collector, reg: UnitRegistry, unit: str, **sample: object) -> None:
    for window in collector._of(reg.units[unit]):
        window.add(**sample)  # type: ignore[arg-type]


def test_nothing_is_kept_outside_a_rollout() -> None:
    reg = registry()
    collector = Collector(reg)
    assert collector.windows() is None
    assert collector._of(reg.units["new"]) == ()


def test_a_new_step_starts_fresh_and_keeps_the_cells_totals() -> None:
    reg = registry()
    collector = Collector(reg)
    split(reg, epoch=1)
    answer(collector, reg, "new", error=True)
    answer(collector, reg, "old")
    first = collector.windows()
    assert first is not None and (first.step.new.errors, first.step.old.requests) == (1, 1)
    split(reg, epoch=2)  # the next step of the same cell
    second = collector.windows()
    assert second is not None and second.step.new.requests == 0
    assert second.before.new.errors == 1 and second.cell.new.errors == 1
    split(reg, epoch=3, moved=frozenset({"a"}))  # the next cell: its own totals
    third = collector.windows()
    assert third is not None and third.cell.new.requests == 0 and third.before.new.requests == 0


def test_the_control_plane_sums_the_workers_windows_of_its_split() -> None:
    reg = registry()
    split(reg, epoch=4)
    workers = [Collector(reg), Collector(reg)]
    answer(workers[0], reg, "new", error=True)
    answer(workers[1], reg, "new")
    answer(workers[1], reg, "old", finish="stop")
    fleet = FleetSamples()
    fleet.units = reg
    for index, worker in enumerate(workers):
        windows = worker.windows()
        assert windows is not None
        fleet.update(index, windows.wire())
    stale = workers[0].windows()
    assert stale is not None
    fleet.update(2, {**stale.wire(), "key": ["r1", 3, 0]})  # a worker still on the last step
    summed = fleet.windows()
    assert summed is not None and summed.key == key_of(reg.canary)  # type: ignore[arg-type]
    assert (summed.step.new.requests, summed.step.new.errors) == (2, 1)
    assert (summed.cell.old.requests, summed.cell.old.stops) == (1, 1)
    fleet.forget(1)
    again = fleet.windows()
    assert again is not None and again.step.new.requests == 1
    reg.set_revisions(Revisions(reg.revisions.serving))
    assert fleet.windows() is None

"""The answers of the two revisions of a running rollout, as the gates judge them.

An observer of the request path: it counts, per revision, each answer that ended (with its
finish reason, its time to first token per uncached prompt token and its time per output
token), each failure of a unit before the first byte (an error of that unit's revision, even
when a retry elsewhere saved the request) and each stream that broke after it (a break of the
broken unit's revision, resumed elsewhere or not). Windows per revision: the step's, which
the gates judge at its end, and the cell's, which the hard guards judge all along (collector
windows are sent by workers to the control plane, which sums them). Nothing is kept outside
a rollout, or for units of other revisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gateway.errors import UpstreamError
from gateway.outcomes import End, Resumption
from gateway.proxy.call import Call
from gateway.revisions import Canary
from gateway.rollout.samples import Window
from gateway.signals import Observer
from gateway.units import UnitRegistry, UnitState

# Ends that break a stream after its first byte (the client's going away is no break).
BROKEN = frozenset({End.RESET, End.IDLE_TIMEOUT, End.TRUNCATED, End.UNIT_ERROR, End.UNIT_EJECTED})


class Pair:
    """One window of each revision."""

    __slots__ = ("new", "old")

    def __init__(self) -> None:
        self.new, self.old = Window(), Window()

    def merge(self, other: Pair) -> None:
        self.new.merge(other.new)
        self.old.merge(other.old)

    def wire(self) -> dict[str, Any]:
        return {"new": self.new.to_wire(), "old": self.old.to_wire()}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Pair:
        pair = cls()
        pair.new, pair.old = Window.from_wire(wire["new"]), Window.from_wire(wire["old"])
        return pair


class Windows:
    """What one split of a rollout collected. `step`: the answers of the cell being moved,
    by revision, which the step's gates judge; `others`: the old revision's answers in the
    cells not yet moved (whole cells' load on each unit, the baseline of a step above 50%);
    `before`: the cell's step before this one (in a cell's first step, the old revision's
    answers in the cells not yet moved during the last cell's last step); `cell`: the new
    revision's answers in every cell since this cell began, and the old revision's since the
    rollout began, which the guards judge. `key` names the split: the rollout,
    its epoch (each step and each resume is a new one) and its cell."""

    __slots__ = ("before", "cell", "key", "new", "old", "others", "step")

    def __init__(self, key: Key, old: str, new: str) -> None:
        self.key, self.old, self.new = key, old, new
        self.step, self.before, self.cell, self.others = Pair(), Pair(), Pair(), Pair()

    def wire(self) -> dict[str, Any]:
        return {
            "key": list(self.key),
            "revisions": [self.old, self.new],
            **{name: getattr(self, name).wire() for name in PAIRS},
        }


PAIRS = ("step", "before", "cell", "others")


def add_wires(into: Windows, wires: Iterable[Mapping[str, Any]]) -> Windows:
    """`into` plus every other process's windows of the same split (`Windows.wire`); windows
    of another split (a step that has ended, not yet replaced) are left out."""
    for wire in wires:
        if tuple(wire["key"]) != into.key:
            continue
        for name in PAIRS:
            mine: Pair = getattr(into, name)
            mine.merge(Pair.from_wire(wire[name]))
    return into


Key = tuple[str, int, int]  # (rollout id, epoch, cell: how many cells it has moved)


def key_of(canary: Canary) -> Key:
    return (canary.id, canary.epoch, len(canary.moved))


class Samples(Protocol):
    """Where a rollout's driver reads its windows: a process's own collector, or with
    workers the sum of theirs (gateway/workers/reports.py)."""

    def windows(self) -> Windows | None: ...


class Collector(Observer[Call]):
    """Collects for the split its registry routes by (`UnitRegistry.canary`): a new split
    (a step begun, a rollout resumed, a cell moved) starts new windows by itself, so a worker
    follows the control plane's rollout from its state messages alone."""

    def __init__(self, units: UnitRegistry) -> None:
        self.units = units
        self._windows: Windows | None = None

    def windows(self) -> Windows | None:
        """The current split's windows (None outside a rollout)."""
        canary = self.units.canary
        if canary is None:
            self._windows = None
            return None
        key = key_of(canary)
        found = self._windows
        if found is not None and found.key == key:
            return found
        fresh = Windows(key, canary.old, canary.new)
        if found is not None and found.key[0] == key[0]:
            if found.key[2] == key[2]:  # the same cell's next step (or its first, after
                # the wait for its units, which collected no step)
                idle = found.step.new.empty and found.step.old.empty
                fresh.before, fresh.cell = found.before if idle else found.step, found.cell
            else:  # the next cell: the old revision's answers so far stay the baselines
                fresh.before.old, fresh.cell.old = found.others.old, found.cell.old
        self._windows = fresh
        return fresh

    def _of(self, unit: UnitState) -> tuple[Window, ...]:
        """The windows an answer of `unit` counts in (none for a unit of neither revision,
        or outside a rollout): the cell's, and the step's where the unit is in the cell being
        moved, or `others` for an old unit of a cell not yet moved."""
        found = self.windows()
        canary = self.units.canary
        if found is None or canary is None:
            return ()
        here = unit.cell == canary.cell
        if unit.revision == found.new:
            return (found.step.new, found.cell.new) if here else (found.cell.new,)
        if unit.revision == found.old:
            if here:
                return found.step.old, found.cell.old
            if unit.cell not in canary.moved:
                return found.others.old, found.cell.old
            return (found.cell.old,)
        return ()

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        for window in self._of(unit):
            window.add(error=True)

    def attempt_opened(self, call: Call, unit: UnitState, status: int) -> None:
        if status >= 500:  # a unit's error answer, relayed (a retry would have been a failure)
            for window in self._of(unit):
                window.add(error=True)

    def resumed(self, call: Call, broken: UnitState, outcome: Resumption, detail: str) -> None:
        for window in self._of(broken):
            window.add(broke=True, resumed=outcome is Resumption.OK)

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        """A whole answer (a broken one is counted by `resumed`, or here when the stream
        could not be resumed at all: no tracker)."""
        if self.units.canary is None or call.status is None or call.status >= 500:
            return  # outside a rollout (most requests): nothing to count in
        if end in BROKEN:
            if call.tracker is None:  # not resumable: `resumed` is never called
                for window in self._of(unit):
                    window.add(broke=True)
            return
        if end is not End.COMPLETE:
            return  # the client left, or a timeout the gateway set: no verdict on the unit
        tracker = call.tracker
        first = call.ttft is not None and (tracker is None or tracker.resumes == 0)
        ttft = call.ttft if first else None
        finish = None if tracker is None else tracker.finish_reason
        uncached = _uncached(call)
        for window in self._of(unit):
            window.add(finish=finish, ttft=ttft, uncached_tokens=uncached, tpot=gap)


def _uncached(call: Call) -> int:
    placed = call.placed
    if placed is not None:
        return max(placed.prompt - placed.cached, 0)
    if call.usage is not None and call.usage.prompt:
        cached = call.usage.cached or 0
        return max(call.usage.prompt - cached, 0)
    return 0  # unknown: the floor of samples.py stands in

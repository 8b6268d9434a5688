"""The answers of the two revisions of a running rollout, as the gates judge them.

An observer of the request path: it counts, per revision, each answer that ended (with its
finish reason, its time to first token per uncached prompt token and its time per output
token), each failure of a unit before the first byte (an error of that unit's revision, even
when a retry elsewhere saved the request) and each stream that broke after it (a break of the
broken unit's revision, resumed elsewhere or not). Two windows per revision: the step's, which
the gates judge at its end, and the cell's, which the hard guards judge all along.
Nothing is kept outside a rollout, or for units of other revisions.
"""

from __future__ import annotations

from gateway.errors import UpstreamError
from gateway.outcomes import End, Resumption
from gateway.proxy.call import Call
from gateway.rollout.samples import Window
from gateway.signals import Observer
from gateway.units import UnitState

# Ends that break a stream after its first byte (the client's going away is no break).
BROKEN = frozenset({End.RESET, End.IDLE_TIMEOUT, End.TRUNCATED, End.UNIT_ERROR, End.UNIT_EJECTED})


class Pair:
    """One window of each revision."""

    __slots__ = ("new", "old")

    def __init__(self) -> None:
        self.new, self.old = Window(), Window()


class Collector(Observer[Call]):
    def __init__(self) -> None:
        self.revisions: tuple[str, str] | None = None  # (old, new) while a rollout runs
        self.step, self.cell = Pair(), Pair()
        self.before = Pair()  # the step before this one (the last cell's 100% step's baseline)

    def start(self, old: str, new: str) -> None:
        """Collect for a rollout of `old` to `new`, from empty windows."""
        self.revisions = (old, new)
        self.step, self.cell, self.before = Pair(), Pair(), Pair()

    def next_step(self) -> None:
        self.step, self.before = Pair(), self.step

    def next_cell(self) -> None:
        self.step, self.cell = Pair(), Pair()

    def stop(self) -> None:
        self.revisions = None

    def _windows(self, unit: UnitState) -> tuple[Window, ...]:
        """The step's and the cell's window of the unit's revision (none for a unit of
        neither revision, or outside a rollout)."""
        revisions = self.revisions
        if revisions is not None:
            if unit.revision == revisions[1]:
                return self.step.new, self.cell.new
            if unit.revision == revisions[0]:
                return self.step.old, self.cell.old
        return ()

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        for window in self._windows(unit):
            window.add(error=True)

    def attempt_opened(self, call: Call, unit: UnitState, status: int) -> None:
        if status >= 500:  # a unit's error answer, relayed (a retry would have been a failure)
            for window in self._windows(unit):
                window.add(error=True)

    def resumed(self, call: Call, broken: UnitState, outcome: Resumption, detail: str) -> None:
        for window in self._windows(broken):
            window.add(broke=True, resumed=outcome is Resumption.OK)

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        """A whole answer (a broken one is counted by `resumed`, or here when the stream
        could not be resumed at all: no tracker)."""
        if self.revisions is None or call.status is None or call.status >= 500:
            return
        if end in BROKEN:
            if call.tracker is None:  # not resumable: `resumed` is never called
                for window in self._windows(unit):
                    window.add(broke=True)
            return
        if end is not End.COMPLETE:
            return  # the client left, or a timeout the gateway set: no verdict on the unit
        tracker = call.tracker
        first = call.ttft is not None and (tracker is None or tracker.resumes == 0)
        ttft = call.ttft if first else None
        finish = None if tracker is None else tracker.finish_reason
        uncached = _uncached(call)
        for window in self._windows(unit):
            window.add(finish=finish, ttft=ttft, uncached_tokens=uncached, tpot=gap)


def _uncached(call: Call) -> int:
    placed = call.placed
    if placed is not None:
        return max(placed.prompt - placed.cached, 0)
    if call.usage is not None and call.usage.prompt:
        cached = call.usage.cached or 0
        return max(call.usage.prompt - cached, 0)
    return 0  # unknown: the floor of samples.py stands in

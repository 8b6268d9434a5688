"""Latency-induced probation ("The Tail at Scale"): a unit whose first copies a hedge keeps
overtaking is slow, whatever its mean latency says.

A hedge that wins while its first copy has not begun says that copy's unit took longer than
the delay plus another unit's whole time to first token: evidence of a straggler that the
latency model never sees, because the overtaken copy is cancelled before its first token. And
a cancelled copy frees its slot at once, so load balancing, which shields a straggler whose
stalled requests stay in flight, sends it its full share: one unit stalling 16% of its
requests had a quarter of the traffic with hedging and a twentieth without, and hedged so many
requests that the fleet's TTFT p99 doubled (docs/benchmarks.md, "Hedged requests").

So each unit's share of answers begun that a hedge overtook is counted over a sliding window
(`Overtaken`), and a unit whose share passes both a floor and `FACTOR` times the fleet's
median (`on_probation`) is put on probation: its prober marks it `slow`, with that reason, so
it gets `[health].slow_weight` of its share of new requests, times the share of its first
copies that were not overtaken (a unit that stalls every request would otherwise keep a
quarter of its share, all of it hedged), and still enough of them for the share to be
measured; once the share falls back (or too few answers are left in the window to
judge), it is healthy again. Pure and synchronous; the clock comes in as `now`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping

from gateway.health_states import Lag
from gateway.routing.window import SlidingSums

FACTOR = 3.0  # a unit's share past this many times the fleet's median (of >= 3 units)
LEAST_KEPT = 0.02  # of slow_weight, the least a unit on probation keeps (to be measured)
LEAST = 20  # answers begun and overtaken copies in the window before a share is judged

_BEGUN, _OVERTAKEN = range(2)


class Overtaken:
    """Per unit, over the last `window` seconds: answers that began on it, and first copies
    of hedged requests on it that the hedge overtook before they began."""

    __slots__ = ("_units", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._units: dict[str, SlidingSums] = {}

    def _sums(self, unit: str) -> SlidingSums:
        sums = self._units.get(unit)
        if sums is None:
            sums = self._units[unit] = SlidingSums(self.window, 2)
        return sums

    def begun(self, unit: str, now: float) -> None:
        """An answer began on `unit` (a first token, hedged or not)."""
        self._sums(unit).add(now, _BEGUN)

    def overtaken(self, unit: str, now: float) -> None:
        """A hedge's second copy answered first while `unit`'s first copy had not begun."""
        self._sums(unit).add(now, _OVERTAKEN)

    def share(self, unit: str, now: float) -> float | None:
        """Of `unit`'s answers begun and copies overtaken in the window, the share overtaken;
        None with fewer than LEAST of them. Only reads (a metrics scrape asks from its own
        thread)."""
        sums = self._units.get(unit)
        if sums is None:
            return None
        overtaken = sums.peek(now, _OVERTAKEN)
        seen = overtaken + sums.peek(now, _BEGUN)
        return overtaken / seen if seen >= LEAST else None

    def shares(self, now: float) -> Iterator[tuple[str, float]]:
        for unit in list(self._units):
            share = self.share(unit, now)
            if share is not None:
                yield unit, share

    def drop(self, unit: str) -> None:
        self._units.pop(unit, None)


def on_probation(shares: Mapping[str, float], floor: float) -> dict[str, float]:
    """Of the units' overtaken shares, those past `floor` and FACTOR times the fleet's median
    (of at least three units: with two, one straggler is half the median), each with its
    share. A fleet whose units all straggle alike puts none on probation: hedging is what
    answers that."""
    if floor <= 0.0 or len(shares) < 3:
        return {}
    bar = max(floor, FACTOR * statistics.median(shares.values()))
    return {unit: share for unit, share in shares.items() if share > bar}


def probation(shares: Mapping[str, float], unit: str, floor: float) -> Lag | None:
    """Why `unit` is on probation (on_probation), or None if it is not; with the share of
    `[health].slow_weight` it keeps: the share of its first copies that were not overtaken
    (at least LEAST_KEPT, rounded to hundredths). A unit whose every copy stalls keeps
    little: what is sent to it waits for a hedge."""
    share = on_probation(shares, floor).get(unit)
    if share is None:
        return None
    median = statistics.median(shares.values())
    reason = (
        f"a hedge overtook {share:.0%} of its first copies before they began"
        f" (the fleet's median: {median:.0%}); on probation"
    )
    return Lag(reason, max(LEAST_KEPT, round(1.0 - share, 2)))

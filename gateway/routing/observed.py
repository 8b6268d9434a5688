"""Each unit's recent times to first token, as observed: what the hedge's delay is made of
until the unit's latency model has learned (latency.py needs `least` answers and their pace,
and is trusted only then).

A gateway that has just started, or a unit just added, has no model yet; a delay of
`max_delay` there waits out any stall shorter than it. So each unit keeps its last `KEPT` first
tokens (uncached prompt tokens, seconds), and `p90` answers with the 90th percentile of those
whose prompt was of a similar length (half to twice, with some slack for short ones), once
there are `LEAST` of them. Pure and synchronous; a bounded ring per unit.
"""

from __future__ import annotations

from collections import deque

KEPT = 64  # first tokens kept per unit
LEAST = 5  # of a similar length, before a percentile is given
SLACK = 64  # tokens: prompts this close count as similar, however short


class ObservedTtft:
    __slots__ = ("_units",)

    def __init__(self) -> None:
        self._units: dict[str, deque[tuple[int, float]]] = {}

    def add(self, unit: str, uncached: int, seconds: float) -> None:
        """A first token on `unit`, `seconds` after its attempt was sent with `uncached`
        prompt tokens to compute."""
        seen = self._units.get(unit)
        if seen is None:
            seen = self._units[unit] = deque(maxlen=KEPT)
        seen.append((uncached, seconds))

    def p90(self, unit: str, uncached: int) -> float | None:
        """The 90th percentile of `unit`'s kept first tokens for prompts of about `uncached`
        tokens; None with fewer than LEAST of them."""
        seen = self._units.get(unit)
        if seen is None:
            return None
        low, high = uncached // 2 - SLACK, 2 * uncached + SLACK
        times = sorted(s for n, s in seen if low <= n <= high)
        if len(times) < LEAST:
            return None
        return times[-(-9 * len(times) // 10) - 1]  # the nearest rank

    def drop(self, unit: str) -> None:
        self._units.pop(unit, None)

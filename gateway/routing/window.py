"""Sums over a sliding window of time, in buckets: what the retry budget and hedging's budget
count (requests, retries, prompt tokens, failures) over their last few seconds.

Each series is a ring of `buckets` counts; time moves the ring forward and what falls out of
the window is subtracted. O(1) per add and per read, whatever the rate; the window's edge is
a bucket wide (a tenth of it, by default)."""

from __future__ import annotations


class SlidingSums:
    def __init__(self, window: float, series: int, buckets: int = 10) -> None:
        self._width = window / buckets
        self._counts = [[0] * buckets for _ in range(series)]
        self._totals = [0] * series
        self._slot = 0

    def add(self, now: float, series: int, amount: int = 1) -> None:
        self._advance(now)
        ring = self._counts[series]
        ring[self._slot % len(ring)] += amount
        self._totals[series] += amount

    def total(self, now: float, series: int) -> int:
        self._advance(now)
        return self._totals[series]

    def peek(self, now: float, series: int) -> int:
        """`total` without moving the ring: safe to call from another thread (a metrics
        scrape) while the loop adds, at worst a count behind."""
        n = len(self._counts[0])
        slot, last = int(now / self._width), self._slot
        ring = self._counts[series]
        return sum(ring[s % n] for s in range(max(last - n, slot - n) + 1, last + 1))

    def _advance(self, now: float) -> None:
        slot = int(now / self._width)
        if slot <= self._slot:
            return
        n = len(self._counts[0])
        for s in range(max(self._slot + 1, slot - n + 1), slot + 1):
            i = s % n
            for k, ring in enumerate(self._counts):
                self._totals[k] -= ring[i]
                ring[i] = 0
        self._slot = slot

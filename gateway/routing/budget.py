"""Retry budget: retries may add at most `ratio` of recent requests plus a small floor.

A fixed "retry 3 times" multiplies load by 4 during a brown-out, exactly when units can least
take it. A budget (Finagle, tower) instead lets retries mask isolated failures and refuses
them once failures are widespread. Counts live in time buckets over a sliding window.
"""

from __future__ import annotations


class RetryBudget:
    def __init__(
        self, ratio: float, min_per_second: float, window: float, buckets: int = 10
    ) -> None:
        self.ratio = ratio
        self.floor = min_per_second * window
        self._width = window / buckets
        self._deposits = [0] * buckets
        self._withdrawals = [0] * buckets
        self._slot = 0
        self._deposited = 0
        self._withdrawn = 0

    def deposit(self, now: float) -> None:
        """Record one original request."""
        self._advance(now)
        self._deposits[self._slot % len(self._deposits)] += 1
        self._deposited += 1

    def withdraw(self, now: float) -> bool:
        """Try to spend one retry; False when the budget is exhausted."""
        self._advance(now)
        if self._withdrawn + 1 > self.floor + self.ratio * self._deposited:
            return False
        self._withdrawals[self._slot % len(self._withdrawals)] += 1
        self._withdrawn += 1
        return True

    def available(self, now: float) -> float:
        self._advance(now)
        return self.floor + self.ratio * self._deposited - self._withdrawn

    def _advance(self, now: float) -> None:
        slot = int(now / self._width)
        if slot <= self._slot:
            return
        n = len(self._deposits)
        for s in range(max(self._slot + 1, slot - n + 1), slot + 1):
            i = s % n
            self._deposited -= self._deposits[i]
            self._withdrawn -= self._withdrawals[i]
            self._deposits[i] = self._withdrawals[i] = 0
        self._slot = slot


class CauseBudget:
    """Resumptions paid per cause, not per stream.

    A leader that dies breaks every stream on it at once: one cause, hundreds of streams.
    Charging each of them to the retry budget drains it in one go and turns the rest into
    errors, although resuming them adds no load (each continuation replaces its broken self,
    and `max_resumes` bounds how often). So the first stream broken by a cause (a unit and a
    failure kind) within `window` seconds pays one retry, and the others broken by it ride on
    that payment, or share its refusal: a fleet whose units break one after another still
    drains the budget cause by cause, which is what it protects against.
    """

    def __init__(self, budget: RetryBudget, window: float = 1.0) -> None:
        self.budget = budget
        self.window = window
        self._causes: dict[tuple[str, str], tuple[float, bool]] = {}

    def withdraw(self, cause: tuple[str, str], now: float) -> bool:
        seen = self._causes.get(cause)
        if seen is not None and now - seen[0] <= self.window:
            return seen[1]
        if len(self._causes) > 1024:  # bounded: old causes go
            self._causes = {c: v for c, v in self._causes.items() if now - v[0] <= self.window}
        granted = self.budget.withdraw(now)
        self._causes[cause] = (now, granted)
        return granted

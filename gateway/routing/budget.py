"""Retry budget: retries may add at most `ratio` of recent requests plus a small floor.

A fixed "retry 3 times" multiplies load by 4 during a brown-out, exactly when units can least
take it. A budget (Finagle, tower) instead lets retries mask isolated failures and refuses
them once failures are widespread. Counts live in time buckets over a sliding window.
"""

from __future__ import annotations

from gateway.routing.window import SlidingSums


class RetryBudget:
    def __init__(
        self, ratio: float, min_per_second: float, window: float, buckets: int = 10
    ) -> None:
        self.ratio = ratio
        self.floor = min_per_second * window
        self._sums = SlidingSums(window, 2, buckets)  # requests, retries

    def deposit(self, now: float) -> None:
        """Record one original request."""
        self._sums.add(now, _REQUESTS)

    def withdraw(self, now: float) -> bool:
        """Try to spend one retry; False when the budget is exhausted."""
        if self.available(now) < 1:
            return False
        self._sums.add(now, _RETRIES)
        return True

    def available(self, now: float) -> float:
        deposited = self._sums.total(now, _REQUESTS)
        return self.floor + self.ratio * deposited - self._sums.total(now, _RETRIES)


_REQUESTS, _RETRIES = 0, 1


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

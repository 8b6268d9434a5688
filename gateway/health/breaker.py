"""Per-unit circuit breakers: pure bookkeeping over live traffic outcomes, the clock passed in.

Probers catch a unit that is down; the breaker catches one that answers probes but fails real
requests (a bad node, a poisoned cache). It is a state machine with unambiguous names (linkerd):
admitting -> ejected for a doubling backoff -> probing with a few trial requests -> admitting.
No asyncio and no I/O here: transitions are returned as values, and the caller logs them once,
exports metrics, writes the registry's `admitting` bit and schedules one timer for `tick()`.

The board holds every unit's breaker so it can apply Envoy's panic cap: ejecting most units
because of a shared cause (an overloaded backend, a bad deploy) would turn a brown-out into an
outage, so past `max_ejected_share` a trip is refused and reported instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from gateway.config import BreakerConfig
from gateway.shares import above_share


class BreakerState(StrEnum):
    ADMITTING = "admitting"
    EJECTED = "ejected"
    PROBING = "probing"


@dataclass(frozen=True, slots=True)
class Transition:
    """A change the I/O layer reports once. `suppressed` marks a trip refused by the panic cap
    (then old == new == ADMITTING); `until` is set when the unit enters EJECTED."""

    unit: str
    old: BreakerState
    new: BreakerState
    reason: str
    at: float
    until: float | None = None
    suppressed: bool = False


class _Window:
    """Outcomes of the last `window` seconds in a ring of time buckets: O(1) per record and no
    queue of timestamps. Old outcomes leave a bucket at a time, so the span is approximate."""

    def __init__(self, window: float, buckets: int = 10) -> None:
        self._width = window / buckets
        self._requests = [0] * buckets
        self._failures = [0] * buckets
        self._slot: int | None = None
        self.requests = 0
        self.failures = 0

    def add(self, ok: bool, now: float) -> None:
        i = self.advance(now) % len(self._requests)
        self._requests[i] += 1
        self.requests += 1
        if not ok:
            self._failures[i] += 1
            self.failures += 1

    def advance(self, now: float) -> int:
        """Drop buckets that fell out of the window; a clock that steps back keeps the slot."""
        slot, last, n = math.floor(now / self._width), self._slot, len(self._requests)
        if last is None or slot - last >= n:
            self.clear()
        elif slot > last:
            for s in range(last + 1, slot + 1):
                self.requests -= self._requests[s % n]
                self.failures -= self._failures[s % n]
                self._requests[s % n] = self._failures[s % n] = 0
        else:
            return last
        self._slot = slot
        return slot

    def clear(self) -> None:
        self._requests = [0] * len(self._requests)
        self._failures = [0] * len(self._failures)
        self.requests = self.failures = 0


class Breaker:
    """One unit's state. It knows nothing of other units, so the board can apply the panic cap
    between "wants to trip" (`observe`) and "trips" (`eject`)."""

    def __init__(self, unit: str, config: BreakerConfig) -> None:
        self.unit = unit
        self.config = config
        self.state = BreakerState.ADMITTING
        self.reason = ""
        self.ejected_at: float | None = None
        self.ejected_until: float | None = None
        self.ejections = 0  # consecutive ejections without a full recovery: the backoff exponent
        self.consecutive = 0
        self.trials_ok = 0
        # (ejected, total) when a suppressed trip was last reported; None once a request succeeds.
        self.suppressed_key: tuple[int, int] | None = None
        self.window = _Window(config.window)

    def stale(self, started: float | None) -> bool:
        """A request that began before the last ejection says nothing about the unit now: LLM
        requests can outlive a 1 s ejection and would otherwise be taken for trial outcomes."""
        return started is not None and self.ejected_at is not None and started <= self.ejected_at

    def observe(self, ok: bool, now: float) -> str | None:
        """Count an outcome while admitting; returns why the unit should trip, if it should."""
        self.window.add(ok, now)
        if ok:
            self.consecutive = 0
            self.suppressed_key = None
        else:
            self.consecutive += 1
            if self.consecutive >= self.config.consecutive_failures:
                return f"{self.consecutive} consecutive failures"
        requests, failures = self.window.requests, self.window.failures
        if requests >= self.config.min_requests and failures / requests >= self.config.failure_rate:
            window = f"{self.config.window:g}"
            return f"failure rate {failures / requests:.0%} over {window} s ({requests} requests)"
        return None

    def eject(self, reason: str, now: float) -> Transition:
        backoff = self.config.base_ejection * 2.0 ** min(self.ejections, 62)
        self.ejected_at = now
        self.ejected_until = now + min(backoff, self.config.max_ejection)
        self.ejections += 1
        self._reset()
        return self._move(BreakerState.EJECTED, reason, now)

    def probe(self, now: float) -> Transition:
        self.trials_ok = 0
        trials = self.config.probe_requests
        return self._move(BreakerState.PROBING, f"ejection over; {trials} trial requests", now)

    def trial(self, ok: bool, now: float) -> Transition | None:
        """A trial outcome while probing: one failure ejects again, with the next backoff."""
        if not ok:
            return self.eject("trial request failed", now)
        self.trials_ok += 1
        if self.trials_ok < self.config.probe_requests:
            return None
        self.ejections = 0
        self.ejected_until = None
        self._reset()
        return self._move(BreakerState.ADMITTING, f"{self.trials_ok} trial requests succeeded", now)

    def suppress(self, reason: str, key: tuple[int, int], now: float) -> Transition | None:
        """Stay admitting with fresh counts; report only the first refusal of an episode."""
        self._reset()
        if self.suppressed_key == key:
            return None
        self.suppressed_key = key
        ejected, total = key
        self.reason = f"trip suppressed by panic cap: {ejected} of {total} units ejected ({reason})"
        state = BreakerState.ADMITTING
        return Transition(self.unit, state, state, self.reason, now, suppressed=True)

    def _reset(self) -> None:
        self.consecutive = 0
        self.window.clear()

    def _move(self, new: BreakerState, reason: str, now: float) -> Transition:
        old, self.state, self.reason = self.state, new, reason
        until = self.ejected_until if new is BreakerState.EJECTED else None
        return Transition(self.unit, old, new, reason, now, until=until)


class BreakerBoard:
    """The breakers of all units, and the panic cap across them."""

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self._breakers: dict[str, Breaker] = {}

    def add(self, unit_id: str) -> None:
        if unit_id in self._breakers:
            raise KeyError(unit_id)
        self._breakers[unit_id] = Breaker(unit_id, self.config)

    def remove(self, unit_id: str) -> None:
        """Unknown ids are ignored: removal may race with the membership listener."""
        self._breakers.pop(unit_id, None)

    def record(
        self, unit_id: str, ok: bool, now: float, started: float | None = None
    ) -> Transition | None:
        """Feed one classified outcome. Pass `started` (same clock) so outcomes of requests that
        were in flight across an ejection are ignored; without it only those that end while
        ejected are. Unknown units are ignored: a unit may be removed mid-request."""
        breaker = self._breakers.get(unit_id)
        if breaker is None or not self.config.enabled or breaker.stale(started):
            return None
        if breaker.state is BreakerState.PROBING:
            return breaker.trial(ok, now)
        if breaker.state is BreakerState.EJECTED:
            return None
        reason = breaker.observe(ok, now)
        return None if reason is None else self._trip(breaker, reason, now)

    def tick(self, now: float) -> list[Transition]:
        """Move every ejected unit whose time is up to probing."""
        return [
            breaker.probe(now)
            for breaker in self._breakers.values()
            if breaker.state is BreakerState.EJECTED
            and breaker.ejected_until is not None
            and now >= breaker.ejected_until
        ]

    def next_deadline(self) -> float | None:
        """When `tick` next has work, so the caller needs one timer, not a polling loop."""
        deadlines = [
            b.ejected_until
            for b in self._breakers.values()
            if b.state is BreakerState.EJECTED and b.ejected_until is not None
        ]
        return min(deadlines, default=None)

    def state(self, unit_id: str) -> BreakerState:
        return self._breakers[unit_id].state

    def trial_cap(self, unit_id: str) -> int | None:
        """The in-flight cap the gate applies while probing; None means no breaker limit."""
        probing = self._breakers[unit_id].state is BreakerState.PROBING
        return self.config.probe_requests if probing else None

    def view(self, unit_id: str, now: float) -> dict[str, object]:
        """JSON-ready state for the admin API; `now` ages the window and the remaining time."""
        b = self._breakers[unit_id]
        b.window.advance(now)
        until = b.ejected_until if b.state is BreakerState.EJECTED else None
        return {
            "state": b.state.value,
            "reason": b.reason,
            "ejected_until": until,
            "ejection_left": None if until is None else max(0.0, until - now),
            "consecutive_ejections": b.ejections,
            "consecutive_failures": b.consecutive,
            "window_requests": b.window.requests,
            "window_failures": b.window.failures,
            "trial_successes": b.trials_ok if b.state is BreakerState.PROBING else None,
        }

    def _trip(self, breaker: Breaker, reason: str, now: float) -> Transition | None:
        """Probing units count as ejected: they are not fully in service."""
        ejected = sum(b.state is not BreakerState.ADMITTING for b in self._breakers.values())
        total = len(self._breakers)
        if above_share(ejected + 1, self.config.max_ejected_share, total):
            return breaker.suppress(reason, (ejected, total), now)
        return breaker.eject(reason, now)

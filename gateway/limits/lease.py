"""Leases: units a process takes from the shared window at once and spends locally.

Taking one unit per request would be a store round trip per request. A lease takes the need
plus an `extra`: a fraction of the room left after the need, split among the live replicas and
capped. Far from the limit the extra is large (a round trip per many requests); near it the
room is small and the extra rounds down to 0 (a round trip per request), so the leases taken
never exceed the limit and the units one replica holds cannot keep another out for long.

A window lease lives in one bucket: its units count in the shared window from the bucket they
were taken in, so they may only be spent within it (spent later they would leave the window
before the admission they stand for). What is left when the bucket ends is returned. In-flight
slots (`Slots`) have no bucket: a process keeps the slots it holds and returns those that stayed
idle for a whole flush interval.
"""

from __future__ import annotations

from dataclasses import dataclass


def lease_extra(room: int, cap: int, fraction: float) -> int:
    """Units taken beyond the need: floor(room * fraction), at most `cap`. `room` is what the
    limit leaves once the need is taken; `fraction` is the lease share over the live replicas.
    The Lua in redis_store.py computes the same expression in the same double arithmetic."""
    if room <= 0:
        return 0
    return max(0, min(cap, int(room * fraction)))


@dataclass(slots=True)
class Lease:
    """Units of one window (requests or tokens) this process took and has not spent."""

    bucket: int  # the bucket they were taken in (and may be spent in)
    unspent: int
    shared_used: int  # the shared window's count just after the take (for the headers)
    empty_at: float  # when the shared window would be empty (for the reset header)

    def covers(self, bucket: int, need: int) -> bool:
        return self.bucket == bucket and self.unspent >= need


@dataclass(slots=True)
class Slots:
    """In-flight slots of one key: `held` taken from the store, `used` by requests."""

    held: int = 0
    used: int = 0
    idle_low: int = 0  # the fewest idle slots (held - used) seen since the last flush

    def idle(self) -> int:
        return self.held - self.used

    def acquire(self) -> bool:
        if self.used >= self.held:
            return False
        self.used += 1
        self.idle_low = min(self.idle_low, self.idle())
        return True

    def release(self) -> None:
        self.used = max(0, self.used - 1)

    def shed(self) -> int:
        """Return the slots idle the whole interval (held shrinks to what churned); restart."""
        surplus = max(0, min(self.idle_low, self.idle()))
        self.held -= surplus
        self.idle_low = self.idle()
        return surplus

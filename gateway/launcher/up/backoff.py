"""Restart delays for a unit: exponential, capped, forgiven after a long enough good run.

Pure (the caller passes the uptime), so the policy is tested without a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """1 s, 2 s, 4 s ... up to `cap`: a unit that crashes at start does not spin a core, and
    one that ran `reset_after` seconds before failing is treated as a fresh failure."""

    base: float = 1.0
    cap: float = 30.0
    reset_after: float = 60.0
    _next: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"backoff: need 0 < base <= cap, got {self.base}, {self.cap}")
        self._next = self.base

    def delay(self, uptime: float) -> float:
        """The wait before the next start, given how long the last run stayed up."""
        if uptime >= self.reset_after:
            self._next = self.base
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay

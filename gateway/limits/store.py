"""The interface to the shared counts: two calls, so another transport is one more module.

- `take`: one atomic step for one key. Every ask (the requests window, the tokens window, the
  in-flight slots) is checked; if all fit, each is charged its need plus a lease extra (a
  window in the bucket of `now`; in-flight slots are added to this process's entry), else
  none is charged. One round trip.
- `push`: a batch of changes, applied atomically, fire-and-forget from the request path's
  point of view: lease returns and token settles (deltas to a window's buckets, never below
  0), admissions made while the store was away (replayed), and the in-flight slots this
  process holds per key (absolute, with an expiry so a dead process's slots are let go).

A store that cannot answer within its timeout raises `StoreDown`; nothing else escapes.
Implementations: memory.py (one process), redis_store.py (the fleet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Dim = Literal["requests", "tokens", "inflight"]


class StoreDown(Exception):
    """The store did not answer (unreachable, timed out, or refused the command)."""


@dataclass(frozen=True, slots=True)
class Ask:
    dim: Dim
    limit: int
    need: int
    cap: int  # the most extra units a lease may add
    fraction: float  # of the room left after the need, taken as extra (see lease.lease_extra)


@dataclass(frozen=True, slots=True)
class Answer:
    granted: int  # need + extra; 0 when the take was refused (then nothing was charged)
    used: int  # the shared count before this take (window: in the span; inflight: fleet-wide)
    frees_at: float  # when `need` fits (the take's `now` if it fits; window.NEVER if it cannot)
    empty_at: float  # when the window is empty (inflight: the take's `now`)


@dataclass(slots=True)
class Changes:
    """What a flush sends: window deltas by (key, dim, bucket), in-flight slots held by key."""

    deltas: dict[tuple[str, Dim, int], int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.deltas or self.held)

    def add(self, key: str, dim: Dim, bucket: int, delta: int) -> None:
        where = (key, dim, bucket)
        value = self.deltas.get(where, 0) + delta
        if value:
            self.deltas[where] = value
        else:
            self.deltas.pop(where, None)

    def merge_under(self, newer: Changes) -> None:
        """Put `newer` on top of these (a failed flush's changes are sent with the next)."""
        for (key, dim, bucket), delta in newer.deltas.items():
            self.add(key, dim, bucket, delta)
        self.held.update(newer.held)


class Store(Protocol):
    # Whether other processes read these counts: then this process reports to the census
    # even while it has nothing to flush.
    shared: bool

    async def take(self, key: str, asks: Sequence[Ask], now: float) -> list[Answer]: ...

    async def push(self, changes: Changes, now: float) -> None: ...

    async def census(self, now: float) -> int:
        """Report this process alive; the processes whose limiters share the store (this one
        included) that reported in the last few seconds."""
        ...

    async def close(self) -> None: ...

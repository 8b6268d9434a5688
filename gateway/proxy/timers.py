"""Coarse timers shared by many objects: one loop timer per slot in use, not one per object.

Every open stream has an idle watchdog (relay.py) with a timer of its own. A timer handle of
the event loop costs about 0.5 KB while it is armed (uvloop's handle, its libuv timer, the
bound callback), for the whole life of the stream. Here the timeline is cut into slots
`resolution` seconds wide; each slot in use holds a set of the objects due in it and one loop
timer, at its end. An object is due at or after the time it asked for, and at most one slot
late. Taking an object out (`discard`) is a set removal, and a slot that empties gives its
loop timer back: nothing stale stays behind to hold an object that ended.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Protocol

log = logging.getLogger(__name__)

RESOLUTION_S = 0.05


class Due(Protocol):
    def due(self) -> None:
        """Its time came (it asks again from here if it still needs to)."""


class TimerSlots:
    __slots__ = ("_slots", "loop", "resolution")

    def __init__(
        self, loop: asyncio.AbstractEventLoop | None = None, resolution: float = RESOLUTION_S
    ) -> None:
        """Timed on `loop`, or on the loop running the first `add`."""
        if resolution <= 0:
            raise ValueError(f"resolution must be positive, not {resolution!r}")
        self.loop, self.resolution = loop, resolution
        self._slots: dict[int, tuple[set[Due], asyncio.TimerHandle]] = {}

    def add(self, when: float, entry: Due) -> int:
        """Call `entry.due()` at `when` (loop time) or up to one slot later; returns the slot,
        which `discard` takes."""
        key = math.ceil(when / self.resolution)
        slot = self._slots.get(key)
        if slot is None:
            loop = self.loop
            if loop is None:
                loop = self.loop = asyncio.get_running_loop()
            handle = loop.call_at(key * self.resolution, self._fire, key)
            slot = self._slots[key] = (set(), handle)
        slot[0].add(entry)
        return key

    def discard(self, key: int, entry: Due) -> None:
        """Take `entry` out of slot `key` (nothing if it is not there: it fired, or left)."""
        slot = self._slots.get(key)
        if slot is None:
            return
        entries, handle = slot
        entries.discard(entry)
        if not entries:
            handle.cancel()
            del self._slots[key]

    def waiting(self) -> int:
        """How many objects are waiting."""
        return sum(len(entries) for entries, _ in self._slots.values())

    def close(self) -> None:
        """Cancel every loop timer; nothing waiting is called."""
        for _, handle in self._slots.values():
            handle.cancel()
        self._slots.clear()

    def _fire(self, key: int) -> None:
        entries, _ = self._slots.pop(key)
        for entry in entries:
            try:
                entry.due()
            except Exception:  # one failing object must not leave the slot's others unwatched
                log.exception("a timer's callback failed")

"""The events log: admin actions and health/breaker transitions, newest last, bounded.

Every state change is recorded once, with its reason and who caused it, so an operator can
answer "why was this unit out of service at 03:12?" from `GET /admin/events`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("unitgate.events")


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # Unix time
    unit: str
    what: str  # e.g. "unhealthy", "healthy", "ejected", "disable", "drain", "add"
    reason: str
    who: str  # "prober", "breaker", or the admin token's name
    replica: str = ""  # the gateway replica that recorded it, in a log shared by a fleet
    # Applies an entry that is already in the fleet's shared log (an admin action made
    # through the shared state): recorded and logged here, never shared a second time.
    echo: bool = False

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        del found["echo"]
        if not self.replica:
            del found["replica"]
        return found


class EventLog:
    def __init__(self, kept: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self._events: deque[Event] = deque(maxlen=kept)
        self._clock = clock
        self._listeners: list[Callable[[Event], None]] = []

    def record(
        self,
        unit: str,
        what: str,
        reason: str,
        who: str,
        level: int = logging.INFO,
        *,
        echo: bool = False,
    ) -> Event:
        """Recorded and logged once: this line is the change's only log line (`level`
        WARNING for the ones an operator must see, a breaker tripping, a panic)."""
        event = Event(self._clock(), unit, what, reason, who, echo=echo)
        self._events.append(event)
        log.log(level, "unit %s: %s (%s) by %s", unit, what, reason, who)
        for listener in self._listeners:
            listener(event)
        return event

    def append(self, event: Event) -> None:
        """An event recorded (and logged) in another process: a worker's, in the control
        plane's log."""
        self._events.append(event)
        for listener in self._listeners:
            listener(event)

    def on_event(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def recent(self, limit: int | None = None, unit: str | None = None) -> list[Event]:
        events = [e for e in self._events if unit is None or e.unit == unit]
        return events if limit is None else events[-limit:]

"""Token events on their way from the engine thread to the consumers' event loops.

Each `call_soon_threadsafe` wakes a loop, and that loop then competes with the engine thread
for the GIL and, on a small host, for a core. So events are queued per loop and handed over
in one call per loop at a moment the engine thread chooses: the leader flushes a step's events
right after sending the next step message, while the followers are busy receiving it, instead
of between the forward and that send, where every microsecond delays the whole unit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Generic, TypeVar

E = TypeVar("E")


class Outbox(Generic[E]):
    """Engine thread only; the consumers only ever see `sink.put_nowait` run on their loop."""

    def __init__(self) -> None:
        self._queued: dict[asyncio.AbstractEventLoop, list[tuple[Callable[[E], None], E]]] = {}

    def put(self, loop: asyncio.AbstractEventLoop, put: Callable[[E], None], event: E) -> None:
        self._queued.setdefault(loop, []).append((put, event))

    def flush(self) -> None:
        queued, self._queued = self._queued, {}
        for loop, deliveries in queued.items():
            with contextlib.suppress(RuntimeError):  # the consumer's loop closed: nobody listens
                loop.call_soon_threadsafe(_deliver_all, deliveries)


def _deliver_all(deliveries: list[tuple[Callable[[E], None], E]]) -> None:
    for put, event in deliveries:
        put(event)

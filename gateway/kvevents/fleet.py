"""The KV event subscribers of every unit that names a publisher (`[[units]] kv_events`), one
task each, feeding one index; the gateway's request path asks it which units hold a prompt's
prefix and whether each unit's entries are trusted.

Each gateway process subscribes on its own (a worker too, with `workers > 1`): no shared
state is on the path. A unit that joins the fleet gets a subscriber; one that leaves has its
subscriber cancelled and its entries dropped. An ejection or an operator's disable changes
nothing here: the unit's cache is still there for when it comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

import zmq.asyncio

from gateway.config import UnitConfig
from gateway.kvevents.index import KvIndex
from gateway.kvevents.keys import block_keys
from gateway.kvevents.subscriber import Source, Subscriber

log = logging.getLogger("unitgate.kvevents")


def _unknown(unit: UnitConfig) -> int | None:
    return None


class KvFleet:
    def __init__(
        self, capacity: int, vocabulary: Callable[[UnitConfig], int | None] = _unknown
    ) -> None:
        """`vocabulary(unit)`: how many token ids the unit's model has, if the gateway knows
        its tokenizer (events naming ids past it are another model's)."""
        self.index = KvIndex(capacity)
        self.vocabulary = vocabulary
        self._context: zmq.asyncio.Context | None = None
        self._subscribers: dict[str, tuple[Subscriber, asyncio.Task[None]]] = {}
        self._running = True  # until stop: no unit joins after it

    def trusted(self, unit: str) -> bool:
        entry = self._subscribers.get(unit)
        return entry is not None and entry[0].trusted

    def subscribers(self) -> dict[str, Subscriber]:
        return {unit: sub for unit, (sub, _) in self._subscribers.items()}

    def index_size(self) -> tuple[int, int]:
        return len(self.index), self.index.orphans

    def subscriber(self, unit: str) -> Subscriber | None:
        entry = self._subscribers.get(unit)
        return entry[0] if entry is not None else None

    def depths(self, prompt: Sequence[int], units: Iterable[str]) -> dict[str, int]:
        """Of `units`, those whose entries are trusted and hold the prompt's first blocks:
        how many of its leading tokens each holds (whole blocks of each unit's own size), as
        the engine counts them (`cached_tokens`)."""
        by_size: dict[int, list[str]] = {}
        for unit in units:
            size = self.index.block_size(unit) if self.trusted(unit) else None
            if size is not None:
                by_size.setdefault(size, []).append(unit)
        found: dict[str, int] = {}
        for size, sized in by_size.items():
            held = self.index.match(block_keys(prompt, size))
            # vLLM computes a prompt's last token whatever it holds: a prompt of whole blocks
            # finds at most the blocks before its last one.
            usable = (len(prompt) - 1) // size
            found.update((u, min(held[u], usable) * size) for u in sized if u in held)
        return found

    def join(self, unit: UnitConfig) -> None:
        """Subscribe to `unit`'s publisher, if it names one (on the running loop)."""
        if not self._running or not unit.kv_events or unit.id in self._subscribers:
            return
        if self._context is None:
            self._context = zmq.asyncio.Context()
        source = Source(unit.id, unit.kv_events, unit.kv_events_replay)
        sub = Subscriber(
            source, self.index, self._context, self._trust, vocabulary=self.vocabulary(unit)
        )
        task = asyncio.get_running_loop().create_task(sub.run(), name=f"kv-events-{unit.id}")
        task.add_done_callback(self._ended)
        self._subscribers[unit.id] = (sub, task)
        log.info("unit %s: reading its KV events from %s", unit.id, unit.kv_events)

    def leave(self, unit: str) -> None:
        entry = self._subscribers.pop(unit, None)
        if entry is not None:
            entry[1].cancel()
        self.index.drop(unit)

    async def stop(self) -> None:
        self._running = False
        entries, self._subscribers = list(self._subscribers.values()), {}
        for _, task in entries:
            task.cancel()
        await asyncio.gather(*(task for _, task in entries), return_exceptions=True)
        if self._context is not None:
            self._context.term()
            self._context = None

    def _trust(self, unit: str, trusted: bool, why: str) -> None:
        if unit not in self._subscribers and trusted is False and why == "stopped":
            return  # a subscriber that was cancelled with its unit: nothing to say
        if trusted:
            log.info("unit %s: KV events trusted (%s)", unit, why)
        else:
            log.warning("unit %s: KV events not trusted, routed approximately: %s", unit, why)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s ended: %r", task.get_name(), exc, exc_info=exc)

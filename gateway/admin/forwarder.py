"""This replica's own events, sent to the fleet's shared log off the paths that record them.

Recording an event is synchronous and happens on the request path (a resumption) or in a
prober; a Redis round trip there would put the store's latency and outages on that path. So
the log's listener only queues the event, and one task sends what has queued, in one
pipeline. While Redis is away the queue holds the latest BACKLOG events (older ones are
dropped and counted, logged once per outage) and is sent when the store is back; the local
log keeps them all meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from redis.exceptions import RedisError

from gateway.admin.shared import RETRY_FIRST_S, RETRY_MAX_S, SharedStore
from gateway.observability.events import Event, EventLog

log = logging.getLogger("unitgate.admin")
BACKLOG = 1_000  # events kept for the shared log while it cannot be reached
BATCH = 200  # events sent in one pipeline


class EventForwarder:
    def __init__(self, store: SharedStore, events: EventLog) -> None:
        self._store = store
        self._queue: deque[Event] = deque(maxlen=BACKLOG)
        self._queued = asyncio.Event()
        self.dropped = 0  # events that never reached the shared log (the queue overflowed)
        for event in events.recent(BACKLOG):  # recorded before the store was set up (probes)
            self._queue_event(event)
        events.on_event(self._queue_event)

    def _queue_event(self, event: Event) -> None:
        if event.echo:  # already in the shared log: an admin action's own entry
            return
        if len(self._queue) == BACKLOG:
            if self.dropped == 0:
                log.warning("the shared events log is behind: dropping its oldest events")
            self.dropped += 1
        self._queue.append(event)
        self._queued.set()

    async def run(self) -> None:
        """Until cancelled: send what has queued, retrying with backoff while Redis is away."""
        delay = RETRY_FIRST_S
        while True:
            await self._queued.wait()
            self._queued.clear()
            while self._queue:
                batch = [self._queue[i] for i in range(min(BATCH, len(self._queue)))]
                try:
                    await self._send(batch)
                except (RedisError, OSError) as exc:
                    log.debug("events not sent to the shared log yet: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                delay = RETRY_FIRST_S
                self._sent(batch)

    async def flush(self, within: float) -> bool:
        """Send what has queued (at shutdown); False if the store did not take it in time."""
        try:
            async with asyncio.timeout(within):
                while self._queue:
                    batch = list(self._queue)[:BATCH]
                    await self._send(batch)
                    self._sent(batch)
        except (RedisError, OSError, TimeoutError):
            return False
        return True

    def _sent(self, batch: list[Event]) -> None:
        """Off the queue only once sent (a failed send keeps them); some may have been pushed
        out by an overflow meanwhile, which drops from the same end."""
        for event in batch:
            if self._queue and self._queue[0] is event:
                self._queue.popleft()

    async def _send(self, batch: list[Event]) -> None:
        async with self._store.client.pipeline(transaction=False) as pipe:
            for event in batch:
                self._store.append_event(pipe, event)
            await pipe.execute()

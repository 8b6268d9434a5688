"""One snapshot of the fleet for every watcher of the status page, pushed as it changes.

Every open page would otherwise poll every unit; instead one producer task builds a snapshot
when something changed (a health, breaker or admin bit, a unit added or removed, an event) or
once a second (probe latencies and in-flight counts move all the time), and hands the same
bytes to every watcher. Bursts are coalesced (at most one snapshot per MIN_GAP_S), a slow
watcher gets the latest snapshot rather than a backlog (its queue holds one), and the task
runs only while someone watches. Annotators add what the metrics say to each snapshot when
the gateway's metrics are given: each unit's recent traffic (requests, tokens and TTFT over the
last seconds, traffic.py), the priority classes and the top tenants (classes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import orjson

MIN_GAP_S = 0.1  # at most 10 snapshots a second, however fast the fleet changes
REFRESH_S = 1.0  # and at least one a second
END = b""  # what a watcher's queue yields when the feed closes

log = logging.getLogger("unitgate.status")

Build = Callable[[], Awaitable[dict[str, Any]]]


class Annotator(Protocol):
    def annotate(self, snapshot: dict[str, Any]) -> None:
        """Add its part to the snapshot (on the event loop: it must be quick)."""


def frame(event: str, data: object) -> bytes:
    """One server-sent event."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class StatusFeed:
    def __init__(self, build: Build, *annotators: Annotator) -> None:
        self._build = build
        self._annotators = annotators
        self._watchers: set[asyncio.Queue[bytes]] = set()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def changed(self, *_: object) -> None:
        """A listener for the registry's and the events log's changes."""
        self._changed.set()

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[asyncio.Queue[bytes]]:
        """A queue of frames (the first one at once), until the block ends or the feed
        closes (then the queue yields END)."""
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        if self._closed:
            queue.put_nowait(END)
        else:
            self._watchers.add(queue)
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run(), name="status")
            self._changed.set()  # the newcomer needs a snapshot now
        try:
            yield queue
        finally:
            self._watchers.discard(queue)
            if not self._watchers:
                await self._stop_task()

    async def close(self) -> None:
        """At shutdown: every watcher's stream ends (the listener need not wait for them)."""
        self._closed = True
        await self._stop_task()
        for queue in self._watchers:
            _replace(queue, END)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), REFRESH_S)
            self._changed.clear()
            try:
                snapshot = await self._build()
                for annotator in self._annotators:
                    annotator.annotate(snapshot)
                data = frame("snapshot", snapshot)
            except Exception:  # a bug must not freeze every open page on its last snapshot
                log.exception("status snapshot failed")
                data = frame("failed", {"error": "the gateway could not build a snapshot"})
            for queue in self._watchers:
                _replace(queue, data)
            await asyncio.sleep(MIN_GAP_S)

    async def _stop_task(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _replace(queue: asyncio.Queue[bytes], data: bytes) -> None:
    """Latest wins: a watcher that has not sent the last snapshot yet gets this one instead."""
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(data)

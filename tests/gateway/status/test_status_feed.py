"""The status feed: one producer for every watcher, latest snapshot wins, nothing left running."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.status.feed import END, StatusFeed, frame


def decoded(data: bytes) -> Any:
    assert data.startswith(b"event: snapshot\ndata: ") and data.endswith(b"\n\n")
    return orjson.loads(data.split(b"data: ", 1)[1])


async def test_watchers_share_snapshots_and_a_slow_one_gets_only_the_latest() -> None:
    built = 0

    async def build() -> dict[str, Any]:
        nonlocal built
        built += 1
        return {"n": built}

    feed = StatusFeed(build)
    async with feed.watch() as fast, feed.watch() as slow:
        assert decoded(await asyncio.wait_for(fast.get(), 1.0))["n"] >= 1
        for _ in range(3):
            feed.changed()
            await asyncio.wait_for(fast.get(), 1.0)
        latest = decoded(await asyncio.wait_for(slow.get(), 1.0))["n"]
        assert latest == built and slow.empty()  # one frame waiting, the newest
        assert feed._task is not None
    assert feed._task is None  # no watcher, no producer


async def test_close_ends_every_watcher_and_refuses_new_ones() -> None:
    async def build() -> dict[str, Any]:
        return {}

    feed = StatusFeed(build)
    async with feed.watch() as queue:
        await asyncio.wait_for(queue.get(), 1.0)
        await feed.close()
        assert await asyncio.wait_for(queue.get(), 1.0) == END
    async with feed.watch() as late:
        assert late.get_nowait() == END


async def test_a_failing_build_is_reported_not_fatal() -> None:
    calls = 0

    async def build() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("bug")
        return {"ok": True}

    feed = StatusFeed(build)
    async with feed.watch() as queue:
        assert await asyncio.wait_for(queue.get(), 1.0) == frame(
            "failed", {"error": "the gateway could not build a snapshot"}
        )
        feed.changed()
        assert decoded(await asyncio.wait_for(queue.get(), 1.0)) == {"ok": True}


async def test_every_annotator_adds_its_part_to_each_snapshot() -> None:
    class Adds:
        def __init__(self, name: str) -> None:
            self.name = name

        def annotate(self, snapshot: dict[str, Any]) -> None:
            snapshot[self.name] = [{"name": "batch"}]

    async def build() -> dict[str, Any]:
        return {"units": []}

    feed = StatusFeed(build, Adds("classes"), Adds("tenants"))
    async with feed.watch() as queue:
        got = decoded(await asyncio.wait_for(queue.get(), 1.0))
    assert got == {"units": [], "classes": [{"name": "batch"}], "tenants": [{"name": "batch"}]}

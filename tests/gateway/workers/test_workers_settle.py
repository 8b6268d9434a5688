"""The control plane's wait for its workers to apply an admin change (`WorkerPool.settled`):
every worker serving must have acknowledged the state as it was when the wait began, a change
not yet broadcast included; a worker between lives is not waited for; the wait is bounded."""

from __future__ import annotations

import asyncio

from gateway.config import config_from_dict
from gateway.observability.fleet import Fleet
from gateway.workers.pool import WorkerPool
from gateway.workers.reports import Reports


class _Link:
    """A worker's link as the pool checks it: open or closing."""

    def __init__(self, closing: bool = False) -> None:
        self.closing = closing

    def is_closing(self) -> bool:
        return self.closing


def _pool(applied: tuple[int, ...]) -> WorkerPool:
    pool = WorkerPool(config_from_dict({}), Reports(), Fleet(), len(applied))
    pool.version = 3
    for worker, version in zip(pool.workers, applied, strict=True):
        worker.writer = _Link()  # type: ignore[assignment]
        worker.ready.set()
        worker.applied = version
    return pool


async def test_it_returns_once_every_worker_acknowledged() -> None:
    pool = _pool((3, 2))
    waiting = asyncio.create_task(pool.settled(2.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # worker 1 is behind
    pool._handle(pool.workers[1], {"t": "applied", "v": 3}, 0.0)
    assert await asyncio.wait_for(waiting, 1.0) is True


async def test_a_change_not_yet_broadcast_is_waited_for() -> None:
    pool = _pool((3, 3))
    pool._dirty = True  # a change made, its broadcast due this loop iteration
    waiting = asyncio.create_task(pool.settled(2.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    for worker in pool.workers:
        pool._handle(worker, {"t": "applied", "v": 4}, 0.0)
    assert await asyncio.wait_for(waiting, 1.0) is True


async def test_a_worker_between_lives_is_not_waited_for() -> None:
    pool = _pool((3, 1, 0))
    pool.workers[1].writer = _Link(closing=True)  # type: ignore[assignment]
    pool.workers[2].ready.clear()  # started, not yet listening
    assert await asyncio.wait_for(pool.settled(2.0), 1.0) is True


async def test_the_wait_is_bounded() -> None:
    pool = _pool((3, 2))
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await pool.settled(0.2) is False
    assert 0.15 <= loop.time() - began < 1.0

"""The gateway's own event loop lag: measured, and kept out of connect timeouts.

A connect the kernel finishes in microseconds must not time out because the gateway's loop
was busy (a burst of thousands of requests) and ran its timers before it looked at the
socket. Real sockets; the lag is made the honest way, by blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.observability.looplag import LoopLag
from gateway.upstream.pool import ConnectionPool, Endpoint
from gateway.upstream.stretch import MAX_STRETCH


@pytest.fixture
async def listening() -> AsyncIterator[Endpoint]:
    server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
    try:
        yield Endpoint(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()
        await server.wait_closed()


async def test_the_lag_is_how_late_the_loop_runs_its_timers() -> None:
    lag = LoopLag(every=0.01, idle_every=0.01)  # a tick every 10 ms, on time or not
    lag.start()
    try:
        await asyncio.sleep(0.05)
        quiet = lag.total
        time.sleep(0.3)  # the loop is stuck, as in a burst
        await asyncio.sleep(0.03)
    finally:
        lag.stop()
    assert quiet < 0.05
    assert 0.25 <= lag.total - quiet < 0.5 and lag.max >= 0.25
    assert lag.histogram.count >= 5


async def connect_while_stuck(pool: ConnectionPool, endpoint: Endpoint, stuck: float) -> bool:
    task = asyncio.create_task(pool.acquire(endpoint))
    await asyncio.sleep(0)  # it reaches the connect: the SYN is out, the kernel answers it
    time.sleep(stuck)  # before the loop has looked at the socket again
    try:
        conn = await task
    except TimeoutError:
        return False
    pool.release(endpoint, conn)
    return True


async def test_a_connect_is_not_timed_out_by_the_gateways_own_lag(listening: Endpoint) -> None:
    """The lag sampler's total moves the deadline on; a pool without one (the probers', whose
    probes judge their own deadlines: test_probe_lookout.py) has a plain deadline."""
    lag = LoopLag(every=0.01)
    lag.start()
    plain = ConnectionPool(0.2, 30.0, 0)
    sampled = ConnectionPool(0.2, 30.0, 0, lag)
    try:
        # The loop is stuck for 2.5 connect timeouts right after the connect went out.
        assert await connect_while_stuck(sampled, listening, 0.5)
        assert not await connect_while_stuck(plain, listening, 0.5)
    finally:
        lag.stop()
        plain.close()
        sampled.close()


async def test_a_connect_gets_the_lag_sampled_though_the_loop_was_idle(
    listening: Endpoint,
) -> None:
    """An idle loop's lag ticks far apart (0.64 s here); a connect out asks for the short
    gap, so a stall shorter than the idle gap is still counted before its deadline. The
    stall (0.3 s) outlasts the connect timeout (0.2 s) and leaves half a second to the
    deadline's limit (4 timeouts), for a loaded machine's own delays on top."""
    lag = LoopLag(every=0.01, idle_every=1.0)
    lag.start()
    aware = ConnectionPool(0.2, 30.0, 0, lag)
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + 5.0
        while lag.histogram.count < 6 and loop.time() < deadline:  # ticks 10, 20 ... 320 ms apart
            await asyncio.sleep(0.005)
        assert lag.histogram.count >= 6
        assert await connect_while_stuck(aware, listening, 0.3)
    finally:
        lag.stop()
        aware.close()


@pytest.fixture
def unanswered() -> Iterator[Endpoint]:
    """A loopback port whose accept queue is full: the kernel drops new SYNs, so a connect
    hangs as it would to a unit that never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):  # more than the queue holds; the rest stay half-open
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.05)
    try:
        yield Endpoint(f"http://127.0.0.1:{port}")
    finally:
        for filler in fillers:
            filler.close()
        server.close()


async def test_a_unit_that_never_answers_still_times_out(unanswered: Endpoint) -> None:
    """The stretch covers the loop's lag, not the unit's silence: the connect still fails,
    within MAX_STRETCH timeouts."""
    lag = LoopLag(every=0.01)
    lag.start()
    pool = ConnectionPool(0.1, 30.0, 0, lag)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        assert not await connect_while_stuck(pool, unanswered, 0.15)
    finally:
        lag.stop()
        pool.close()
    assert loop.time() - started < 0.1 * MAX_STRETCH + 0.1

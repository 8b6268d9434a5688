"""Probe deadlines measured in the loop's responsive time (gateway/proxy/stretch.py, no lag
sampler): an answer that came in time is read though the gateway's own loop was stuck past
the deadline, and a node that does not answer still times out, unstretched when the loop
keeps up. Real sockets; the node is a thread with its own sockets, so it answers while the
gateway's loop is stuck, as another machine would; the stall is made by blocking the loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.health.probe import ProbeFailed, Target, get
from gateway.proxy.pool import ConnectionPool
from gateway.proxy.stretch import GRACE, MAX_STRETCH, Stretch

# The probes' default is 0.2 s. Twice that here: after a stall that held up the connect, the
# node (a thread of this process, sharing its CPU and GIL) must answer within the grace, a
# quarter of the timeout. With 0.2 s one run in about 200 timed out there (none in 200 more).
TIMEOUT = 0.4
ANSWER = b'HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{"status":"ok"}'


@contextlib.contextmanager
def node(delay: float = 0.0, silent: bool = False) -> Iterator[str]:
    """A node on a thread: answers each request head `delay` s after it came, or never."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.05)
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        conn.settimeout(0.05)
        pending = b""
        with conn:
            while not done.is_set():
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                pending += data
                while b"\r\n\r\n" in pending:
                    _, pending = pending.split(b"\r\n\r\n", 1)
                    if silent:
                        continue
                    time.sleep(delay)
                    conn.sendall(ANSWER)

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        server.close()


async def probe_while_stuck(url: str, stuck: float, warm: bool) -> float:
    """A probe whose loop is stuck for `stuck` s right after it went out; its latency."""
    pool = ConnectionPool(TIMEOUT, 30.0, 0)
    target = Target(url)
    try:
        if warm:  # a keep-alive connection, as every probe after the first has
            await get(pool, target, TIMEOUT)
        task = asyncio.create_task(get(pool, target, TIMEOUT))
        await asyncio.sleep(0)  # the probe is out: connect (or request) sent
        time.sleep(stuck)  # the node answers meanwhile; the loop does not look
        _, _, ms = await task
        return ms
    finally:
        pool.close()


@pytest.mark.parametrize("warm", [False, True], ids=["connecting", "keep-alive"])
async def test_an_answer_that_came_in_time_is_read_after_the_loop_was_stuck(warm: bool) -> None:
    with node() as url:
        ms = await probe_while_stuck(url, 2.5 * TIMEOUT, warm)
    assert ms >= 2.5 * TIMEOUT * 1000


async def test_a_node_answering_just_after_the_stall_is_given_its_round_trip() -> None:
    """The loop was stuck while connecting, so the request goes out only after the stall; the
    node then takes 20 ms: the lateness alone would leave the deadline a millisecond, the
    grace leaves it a round trip."""
    with node(delay=0.02) as url:
        ms = await probe_while_stuck(url, 2.5 * TIMEOUT, warm=False)
    assert ms >= 2.5 * TIMEOUT * 1000


async def test_without_the_stretch_the_stall_times_the_answer_out() -> None:
    """The control: the same stall under a bare deadline is a timeout, so the tests above
    would fail without the stretch."""
    with node() as url:
        reader, writer = await asyncio.open_connection(*url[7:].split(":"))
        try:
            for stretched in (False, True):
                loop = asyncio.get_running_loop()
                try:
                    async with asyncio.timeout(TIMEOUT) as deadline:
                        stretch = Stretch(deadline, loop) if stretched else None
                        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                        time.sleep(2.5 * TIMEOUT)
                        head = await reader.readuntil(b"\r\n\r\n")
                        await reader.readexactly(15)
                        if stretch is not None:
                            stretch.cancel()
                    assert stretched and head.startswith(b"HTTP/1.1 200")
                except TimeoutError:
                    assert not stretched
        finally:
            writer.close()


async def test_a_silent_node_times_out_on_time_when_the_loop_keeps_up() -> None:
    with node(silent=True) as url:
        pool = ConnectionPool(TIMEOUT, 30.0, 0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(ProbeFailed, match="no answer within 400 ms"):
                await get(pool, Target(url), TIMEOUT)
        finally:
            pool.close()
        assert loop.time() - started < TIMEOUT + 0.05


async def test_a_silent_node_still_times_out_after_a_stall() -> None:
    """Within MAX_STRETCH timeouts, the stall included."""
    with node(silent=True) as url:
        pool = ConnectionPool(TIMEOUT, 30.0, 0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = asyncio.create_task(get(pool, Target(url), TIMEOUT))
        await asyncio.sleep(0)
        time.sleep(2.5 * TIMEOUT)
        try:
            with pytest.raises(ProbeFailed, match="no answer within 400 ms"):
                await task
        finally:
            pool.close()
        elapsed = loop.time() - started
        assert 2.5 * TIMEOUT + GRACE * TIMEOUT - 0.01 <= elapsed < MAX_STRETCH * TIMEOUT + 0.05

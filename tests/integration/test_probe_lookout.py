"""Probe deadlines judged by what the socket shows (gateway/health/lookout.py): an answer
that came in time is read though the gateway's own loop was stuck past the deadline, and a
node that does not answer times out close to its timeout, however late the gateway's timers
ran. Real sockets; the node is a thread with its own sockets, so it answers while the
gateway's loop is stuck, as another machine would; the stall is made by blocking the loop
(to the loop, a process the machine did not run looks the same)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.health.lookout import LIMIT
from gateway.health.probe import ProbeFailed, Target, exchange, get, probe_pool

# Times probes to within 50 ms: it runs alone in `make test`.
pytestmark = pytest.mark.serial

# The probes' default is 0.2 s; twice that here, so that the node (a thread of this process,
# sharing its CPU and GIL) has room to answer after a stall.
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
    pool = probe_pool(TIMEOUT, 30.0)
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


async def test_a_node_answering_just_after_the_stall_is_given_its_timeout() -> None:
    """The loop was stuck while connecting, so the request goes out only after the stall; the
    node then takes 20 ms: its timeout counts from when the request went out."""
    with node(delay=0.02) as url:
        ms = await probe_while_stuck(url, 2.5 * TIMEOUT, warm=False)
    assert ms >= 2.5 * TIMEOUT * 1000


async def test_without_the_lookout_the_stall_times_the_answer_out() -> None:
    """The control: the same stall under a bare deadline is a timeout, so the tests above
    would fail without the lookout."""
    with node() as url:
        pool = probe_pool(TIMEOUT, 30.0)
        target = Target(url)
        try:
            await get(pool, target, TIMEOUT)  # warm: the request goes out before the stall
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(TIMEOUT):
                    task = asyncio.create_task(exchange(pool, target.endpoint, target.head, b""))
                    await asyncio.sleep(0)
                    time.sleep(2.5 * TIMEOUT)
                    await task
        finally:
            pool.close()


async def test_a_silent_node_times_out_on_time_when_the_loop_keeps_up() -> None:
    with node(silent=True) as url:
        pool = probe_pool(TIMEOUT, 30.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(ProbeFailed, match="no answer within 400 ms"):
                await get(pool, Target(url), TIMEOUT)
        finally:
            pool.close()
        assert loop.time() - started < TIMEOUT + 0.05


async def test_a_silent_node_still_times_out_after_a_stall() -> None:
    """The stall held up the connect, so the request went out after it: the node's timeout
    counts from then, within LIMIT timeouts of the start."""
    with node(silent=True) as url:
        pool = probe_pool(TIMEOUT, 30.0)
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
        assert 3.5 * TIMEOUT - 0.01 <= elapsed < LIMIT * TIMEOUT + 0.05


@pytest.mark.parametrize("late", [0.01, 0.1])
async def test_a_silent_node_times_out_when_the_timer_runs_late(late: float) -> None:
    """The request went out on time; the machine then runs the gateway's timers `late` s
    late, around the deadline: the socket is empty, so the probe times out then, not a share
    of the timeout later (a frozen node is found on time on a busy machine)."""
    with node(silent=True) as url:
        pool = probe_pool(TIMEOUT, 30.0)
        target = Target(url)
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            task = asyncio.create_task(get(pool, target, TIMEOUT))
            await asyncio.sleep(TIMEOUT - 0.02)  # out, and nearly due
            time.sleep(late + 0.02)  # the timers come due meanwhile and run `late` s late
            with pytest.raises(ProbeFailed, match="no answer within 400 ms"):
                await task
        finally:
            pool.close()
        assert loop.time() - started < TIMEOUT + late + 0.02

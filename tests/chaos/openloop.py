"""An open-loop client for the priority and tenant scenarios: requests sent on a fixed
schedule whatever the answers (as real traffic is), each with its own headers, each timed to
its first byte. The scenarios' own load generator (harness.py) is closed-loop per worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from tests.support import chat_body


@dataclass
class Result:
    label: str  # what the scenario calls this request's sender (a class, a tenant)
    status: int | None = None
    ttft: float | None = None
    completed: bool = False


async def one(http: aiohttp.ClientSession, url: str, label: str, headers: dict[str, str]) -> Result:
    result = Result(label)
    started = time.perf_counter()
    try:
        async with http.post(url, json=chat_body(True), headers=headers) as resp:
            result.status = resp.status
            if resp.status != 200:
                await resp.read()
                return result
            first = True
            async for _chunk in resp.content.iter_any():
                if first:
                    result.ttft, first = time.perf_counter() - started, False
            result.completed = True
    except (aiohttp.ClientError, TimeoutError):
        pass
    return result


Sender = Callable[[int], tuple[str, dict[str, str]]]  # request i -> (label, headers)


async def open_loop(url: str, rate: float, duration: float, sender: Sender) -> list[Result]:
    """`rate` requests a second for `duration` seconds, request i as `sender(i)` says."""
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        tasks: list[asyncio.Task[Result]] = []
        start = time.perf_counter()
        for i in range(int(rate * duration)):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            label, headers = sender(i)
            tasks.append(asyncio.create_task(one(http, url, label, headers)))
        return list(await asyncio.gather(*tasks))


async def closed_loop_capacity(
    url: str, concurrency: int, duration: float, headers: dict[str, str] | None = None
) -> float:
    """Requests a second the units complete with `concurrency` requests always in flight."""
    done: list[float] = []
    stop = time.perf_counter() + duration
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:

        async def worker() -> None:
            while time.perf_counter() < stop:
                result = await one(http, url, "capacity", headers or {})
                if result.completed:
                    done.append(time.perf_counter())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    assert len(done) >= 10, f"the capacity run completed only {len(done)} requests"
    return (len(done) - 1) / (max(done) - min(done))

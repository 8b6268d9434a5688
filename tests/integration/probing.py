"""Gateways whose probers decide, and load to watch them by: what the health tests share.

Times are loop times; a flip is stamped by the registry's change listener as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.health.supervisor import HealthSupervisor
from gateway.observability.events import EventLog
from gateway.server import Gateway, running
from gateway.units import BitChange
from tests.support import chat_body, gateway_config


@dataclass
class Probed:
    gw: Gateway
    health: HealthSupervisor
    events: EventLog
    flips: list[tuple[float, BitChange]] = field(default_factory=list)

    def flip_time(self, unit: str, healthy: bool) -> float:
        """When the unit last flipped to (or within) routable or not."""
        return next(t for t, c in reversed(self.flips) if c.unit.id == unit and c.value is healthy)

    def reason(self, unit: str) -> str:
        return self.gw.units.units[unit].reasons.get("healthy", "")


@contextlib.asynccontextmanager
async def probed(units: list[dict[str, Any]], **health: Any) -> AsyncIterator[Probed]:
    """A gateway with its units probed (default settings unless overridden)."""
    config = gateway_config(units, health={"enabled": True, **health})
    async with running(config) as gw:
        state = Probed(gw, gw.health, gw.events)
        loop = asyncio.get_running_loop()
        gw.units.on_change(
            lambda c: state.flips.append((loop.time(), c)) if c.bit == "healthy" else None
        )
        yield state


async def until(ready: Callable[[], bool], within: float, what: str) -> float:
    """Poll `ready` with a deadline; returns how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not ready():
        if loop.time() - start > within:
            raise AssertionError(f"{what}: not within {within} s")
        await asyncio.sleep(0.005)
    return loop.time() - start


def all_probed_ok(p: Probed) -> bool:
    units = p.gw.units.units.values()
    return all(u.healthy and all(n.healthy for n in u.nodes) for u in units)


class Traffic:
    """Requests sent back to back through the gateway: (loop time sent, status, unit)."""

    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url, self.http = url + "/v1/chat/completions", http
        self.sent: list[tuple[float, int, str]] = []
        self._tasks = [asyncio.create_task(self._client()) for _ in range(3)]

    async def _client(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            try:
                async with self.http.post(self.url, json=chat_body(stream=False)) as resp:
                    await resp.read()
                    self.sent.append((start, resp.status, resp.headers.get("x-unitgate-unit", "")))
            except aiohttp.ClientError as exc:
                self.sent.append((start, -1, repr(exc)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.wait(self._tasks, timeout=5)

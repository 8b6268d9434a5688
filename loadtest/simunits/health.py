"""Node /health of the simulated units test tool, shaped like a real engine node's.

`step` is shared by all nodes of a unit because in a real unit every node takes part in
every engine step; a gateway compares it across polls to spot a hung unit.
"""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from loadtest.simunits.jsonhttp import json_response
from loadtest.simunits.state import HealthMode
from loadtest.simunits.unit import SimUnit, wait_forever


class NodeHealthApi:
    def __init__(self, unit: SimUnit, rank: int) -> None:
        self._unit = unit
        self._rank = rank

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/health", self.health)]

    async def health(self, request: web.Request) -> web.Response:
        state = self._unit.state
        node = state.health[self._rank]
        if node.mode is HealthMode.UNRESPONSIVE:
            await wait_forever()
        if node.mode is HealthMode.SLOW:
            await asyncio.sleep(node.delay_ms / 1000)
        unhealthy = node.mode is HealthMode.UNHEALTHY
        leader = self._rank == 0
        body = {
            "status": "unhealthy" if unhealthy else "ok",
            "role": "leader" if leader else "follower",
            "unit": state.unit_id,
            "rank": self._rank,
            "pid": os.getpid(),
            "step": state.stats.step,
            "pending": state.stats.in_flight if leader else 0,
        }
        return json_response(body, 503 if unhealthy else 200)

"""The lean front: the public listener's protocol, serving the proxy's routes itself and
handing every other request to aiohttp.

aiohttp serves a request with about 10 KB of objects held for its whole life (its request,
payload stream, writer, response, two tasks) and some 35 us of Python per request; for an
open stream that is half of what the gateway holds. The lean front serves the streamed routes
with one small request object and one task, and leaves everything else (other routes, the
rare shapes of a request it does not take: see head.py) to aiohttp's own handler, on the same
connection, so their answers are exactly aiohttp's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from gateway.front.head import QuickHead
from gateway.front.linger import Linger, LingerLimits
from gateway.front.protocol import FrontProtocol, LeanRoute

log = logging.getLogger("unitgate.front")


class Front:
    """The protocol factory of the public listener, and what its connections share."""

    def __init__(
        self,
        routes: Mapping[str, LeanRoute],
        fallback: Callable[[], asyncio.Protocol],
        *,
        keepalive: float,
        cors: bool,
        linger: LingerLimits = LingerLimits(),  # noqa: B008  # frozen: shared safely
        quick: QuickHead | None = None,
    ) -> None:
        """`quick`: the native relay's reader of common request heads (head.py), if built."""
        self.routes: Mapping[bytes, LeanRoute] = {p.encode(): r for p, r in routes.items()}
        self.fallback = fallback  # aiohttp's RequestHandler for one connection
        self.keepalive = keepalive
        self.cors = cors  # CORS is on: a request with an Origin goes to aiohttp
        self.quick = quick
        self.connections: set[FrontProtocol] = set()
        self.linger = linger  # the bounds of a lingering close (linger.py)
        self.lingering: set[Linger] = set()
        self.closing = False

    def __call__(self) -> FrontProtocol:
        return FrontProtocol(self)

    async def shutdown(self, grace: float) -> None:
        """Close idle connections, give requests in flight and lingering closes `grace`
        seconds in all to end, then cancel or close what is left (as aiohttp's own shutdown
        does with its connections)."""
        self.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for connection in list(self.connections):
            connection.close_idle()
        await self._requests_end(grace)
        await self._lingered(deadline - loop.time())

    async def _requests_end(self, grace: float) -> None:
        """Requests in flight end within `grace`, or are cancelled."""
        tasks = {c.task for c in self.connections if c.task is not None}
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            log.info("front: %d requests in flight after %g s, cancelled", len(pending), grace)
            await asyncio.wait(pending)

    async def _lingered(self, within: float) -> None:
        """Lingering closes (those of requests just answered too) end within `within`, or
        are ended."""
        if not self.lingering:
            return
        ending = {linger.done for linger in self.lingering}
        if within > 0:
            _, ending = await asyncio.wait(ending, timeout=within)
        for linger in list(self.lingering):
            linger.close("the gateway stops")
        if ending:
            await asyncio.wait(ending)

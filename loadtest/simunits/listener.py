"""One HTTP listener of the simulated units test tool.

Owns its aiohttp runner and every request task it serves, so shutdown can cancel hung and
stalled requests instead of waiting for clients, and so the "refuse" fault can give up the
listening socket and later take the very same port back.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.base.net import LISTEN_BACKLOG
from loadtest.simunits.topology import Address

# Handlers are cancelled explicitly before cleanup, so this only bounds stragglers.
_SHUTDOWN_TIMEOUT_S = 1.0
# Loop iterations allowed for closed sockets to be released; one or two suffice.
_CLOSE_ROUNDS = 10


class Listener:
    def __init__(self, address: Address, routes: Iterable[web.RouteDef]) -> None:
        app = web.Application(middlewares=[self._track])
        app.add_routes(routes)
        # handler_cancellation: a client that goes away must stop its stream at once.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
        )
        self._host = address.host
        self._port = address.port
        self._site: web.TCPSite | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._busy: collections.Counter[object] = collections.Counter()

    @property
    def address(self) -> Address:
        return Address(self._host, self._port)

    @property
    def url(self) -> str:
        return self.address.url()

    async def start(self) -> None:
        await self._runner.setup()
        try:
            await self.open()
        except BaseException:
            await self._runner.cleanup()
            raise

    async def open(self) -> None:
        """Bind; after the first bind the port is fixed so a re-open takes the same one."""
        if self._site is not None:
            return
        site = web.TCPSite(self._runner, self._host, self._port, backlog=LISTEN_BACKLOG)
        await site.start()
        self._site = site
        self._port = site.port

    async def close_socket(self) -> None:
        """Refuse new connections and drop idle keep-alive ones; running requests go on.

        Idle pooled connections are closed too, else a client would keep reaching the
        "refusing" node through its connection pool.
        """
        site, self._site = self._site, None
        if site is None:
            return
        await site.stop()
        server = self._runner.server
        if server is None:
            return
        idle = [conn for conn in server.connections if not self._busy[conn]]
        for conn in server.connections:
            if conn in idle:
                conn.force_close()
            else:
                conn.close()
        # Let the loop finish closing the idle sockets, so their FINs are on the wire
        # before whoever asked for the refusal hears back and tries again.
        for _ in range(_CLOSE_ROUNDS):
            if not any(conn in idle for conn in server.connections):
                break
            await asyncio.sleep(0)

    async def stop(self) -> None:
        await self.close_socket()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._runner.cleanup()

    @web.middleware
    async def _track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        protocol = request.protocol
        self._tasks.add(task)
        self._busy[protocol] += 1
        try:
            return await handler(request)
        finally:
            self._tasks.discard(task)
            self._busy[protocol] -= 1
            if not self._busy[protocol]:
                del self._busy[protocol]

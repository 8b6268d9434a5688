"""The admin API as one part of the gateway: built with it, started before its listeners open.

Start-up order matters: the saved overrides must be back in the registry before the public
listener takes its first request, or a unit the operator disabled would serve for a moment
after every restart. Mounted as a sub-application of the operator listener, the admin's
`cleanup_ctx` runs while that listener is being set up, which is before either one opens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.admin.api import AdminApi
from gateway.admin.auth import Authenticator, authenticator
from gateway.admin.service import AdminService
from gateway.admin.store import Store
from gateway.admin.view import BreakerView, WorkersView
from gateway.config import Config
from gateway.observability.events import EventLog
from gateway.units import UnitRegistry


class Admin:
    def __init__(
        self,
        config: Config,
        units: UnitRegistry,
        events: EventLog,
        breaker_view: BreakerView | None = None,
        workers: WorkersView | None = None,
    ) -> None:
        self._config = config
        self.service = AdminService(config, units, events)
        self._auth: Authenticator | None = None
        self.api = AdminApi(self.service, self._authenticator, breaker_view, workers)

    def app(self) -> web.Application:
        """The routes (to mount at /admin/), owning the token check and the state file."""
        app = self.api.app()
        app.cleanup_ctx.append(self._lifespan)
        return app

    async def _lifespan(self, _: web.Application) -> AsyncIterator[None]:
        admin = self._config.admin
        # The token may come from a file: read it off the event loop like the state file.
        self._auth = await asyncio.to_thread(authenticator, admin, self._config.metrics.host)
        if not admin.state_file:
            yield
            return
        store = await Store.open(admin.state_file)
        try:
            await self.service.restore(store)
            yield
        finally:
            await store.close()

    def _authenticator(self) -> Authenticator:
        if self._auth is None:
            raise RuntimeError("the admin API served a request before it started")
        return self._auth

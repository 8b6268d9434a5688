"""The admin API as one part of the gateway: built with it, started before its listeners open.

Start-up order matters: the saved overrides must be back in the registry before the public
listener takes its first request, or a unit the operator disabled would serve for a moment
after every restart. Mounted as a sub-application of the operator listener, the admin's
`cleanup_ctx` runs while that listener is being set up, which is before either one opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.admin.api import AdminApi
from gateway.admin.auth import Authenticator, authenticator
from gateway.admin.forwarder import EventForwarder
from gateway.admin.replicas import Heartbeat
from gateway.admin.service import AdminService
from gateway.admin.shared import SharedStore
from gateway.admin.shared_rollouts import SharedRollouts
from gateway.admin.store import Store, StoreError
from gateway.admin.view import BreakerView, Settle, WorkersView
from gateway.auth.ring import KeyRing
from gateway.base.tasks import end
from gateway.config import Config
from gateway.observability.events import EventLog
from gateway.observability.metrics import Metrics
from gateway.observability.rollout_metrics import RolloutCollector, RolloutEnds
from gateway.rollout.collector import Samples
from gateway.rollout.rollouts import Rollouts
from gateway.status.classes import ClassesAndTenants
from gateway.status.feed import Annotator, StatusFeed
from gateway.status.latency import Figures, Latency
from gateway.status.page import StatusPage
from gateway.status.traffic import Traffic
from gateway.units import UnitRegistry

log = logging.getLogger("unitgate.admin")
STOP_WITHIN_S = 0.5  # for the state follower to return by itself at shutdown


class Admin:
    def __init__(
        self,
        config: Config,
        units: UnitRegistry,
        events: EventLog,
        breaker_view: BreakerView | None = None,
        workers: WorkersView | None = None,
        metrics: Metrics | None = None,
        keys: KeyRing | None = None,
        settle: Settle | None = None,
        latency: Figures | None = None,
        samples: Samples | None = None,
    ) -> None:
        """`latency`: each unit's learned latency figures, for the status page; `samples`:
        where a rollout's answers are counted (None: this process drives no rollout)."""
        self._config = config
        self.service = AdminService(config, units, events, keys=keys)
        self._auth: Authenticator | None = None
        self.rollouts = (
            None if samples is None else Rollouts(config, units, self.service, events, samples)
        )
        self.api = AdminApi(
            self.service, self._authenticator, breaker_view, workers, settle, self.rollouts
        )
        if metrics is not None and self.rollouts is not None:
            metrics.registry.register(RolloutCollector(self.rollouts.view))
            RolloutEnds(metrics.registry, events)
        # The status page (/status) shows what the admin API does, pushed on every change,
        # and each unit's recent traffic, the classes and the top tenants from the metrics.
        found: list[Annotator] = []
        if metrics is not None:
            found += [Traffic(metrics), ClassesAndTenants(metrics)]
        if latency is not None:
            found.append(Latency(latency))
        feed = StatusFeed(self.api.snapshot, *found)
        units.on_change(feed.changed)
        units.on_membership(feed.changed)
        units.on_panic(feed.changed)
        events.on_event(feed.changed)
        self.status = StatusPage(feed, self._authenticator)

    def app(self) -> web.Application:
        """The routes (to mount at /admin/), owning the token check and the state file."""
        app = self.api.app()
        app.cleanup_ctx.append(self._lifespan)
        return app

    async def _lifespan(self, _: web.Application) -> AsyncIterator[None]:
        admin = self._config.admin
        # The token may come from a file: read it off the event loop like the state file.
        self._auth = await asyncio.to_thread(authenticator, admin, self._config.metrics.host)
        if self._config.state.backend == "redis":
            async with self._shared():
                yield
            return
        if not admin.state_file:
            async with self._driving(None):
                yield
            return
        store = await Store.open(admin.state_file)
        try:
            await self.service.restore(store)
            async with self._driving(store):
                yield
        finally:
            await store.close()

    @contextlib.asynccontextmanager
    async def _driving(self, store: Store | None) -> AsyncIterator[None]:
        """The rollouts back from the store (a live one carries on), stopped at shutdown."""
        rollouts = self.rollouts
        if rollouts is None:
            yield
            return
        await rollouts.restore(store)
        try:
            yield
        finally:
            await rollouts.stop()

    @contextlib.asynccontextmanager
    async def _shared(self) -> AsyncIterator[None]:
        """The fleet's state from Redis, followed for as long as the gateway runs. Redis being
        down at start does not stop the gateway: it serves from its config file (and refuses
        admin writes) until the follower reaches the store and converges."""
        store = SharedStore(self._config.state)
        heartbeat = Heartbeat(store, self._config.state, self._counts)
        forwarder = EventForwarder(store, self.service.events)
        self.service.on_version(lambda _version: heartbeat.poke())
        await self.service.share(store, heartbeat)
        try:
            await self.service.converge()
        except StoreError as exc:
            log.warning("%s; serving from the config file until it is back", exc)
        rollouts = self.rollouts
        if rollouts is not None:
            self.service.on_version(lambda _version: rollouts.poke())
            await rollouts.share(SharedRollouts(store, self._config.state))
        follower = asyncio.create_task(store.follow(self.service.converge), name="state-follow")
        beats = asyncio.create_task(heartbeat.run(), name="state-heartbeat")
        forwarding = asyncio.create_task(forwarder.run(), name="state-events")
        try:
            yield
        finally:
            if rollouts is not None:
                await rollouts.stop()
            store.stop()
            await asyncio.wait({follower}, timeout=STOP_WITHIN_S)  # it returns by itself
            await end(beats, forwarding, follower, within=STOP_WITHIN_S, log=log)
            # By now the gateway has drained: nothing of this replica's is in flight.
            await forwarder.flush(STOP_WITHIN_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_WITHIN_S):
                    await heartbeat.leave()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_WITHIN_S):
                    await store.close()

    def _counts(self) -> tuple[int, dict[str, int]]:
        """The state version routed by and the in-flight counts, read in one go."""
        units = self.service.units.units.values()
        return self.service.converged_version, {u.id: u.inflight for u in units if u.inflight}

    def _authenticator(self) -> Authenticator:
        if self._auth is None:
            raise RuntimeError("the admin API served a request before it started")
        return self._auth

"""Gateway lifecycle: build the parts, start the listeners, drain and stop in reverse order.

Shutdown is one routine: mark draining (readyz turns 503), close the listeners, let in-flight
answers finish for up to `shutdown_timeout`, cancel what is left, then close the upstream pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from gateway.admin.runtime import Admin
from gateway.admin.view import Settle, WorkersView
from gateway.app import lean_routes, ops_app, public_app
from gateway.auth.check import Gatekeeper
from gateway.auth.ring import KeyRing
from gateway.base import readyfile
from gateway.base.net import KEEPALIVE_S, LISTEN_BACKLOG
from gateway.base.oslimits import stream_budget
from gateway.config import Config
from gateway.front.protocol import LeanRoute
from gateway.front.server import Front
from gateway.health.feed import BreakerFeed, Record
from gateway.health.gate import BreakerGate
from gateway.health.prober import Traffic, live_count
from gateway.health.supervisor import HealthSupervisor
from gateway.heap import freeze_startup
from gateway.knowledge import UnitKnowledge
from gateway.limits.build import build_limiter
from gateway.limits.limiter import Limiter
from gateway.observability import access_log
from gateway.observability.audit import AuditObserver
from gateway.observability.events import EventLog
from gateway.observability.fairness import TokenWindow
from gateway.observability.health_observers import health_signals
from gateway.observability.latency_metrics import Figures
from gateway.observability.looplag import LoopLag
from gateway.observability.metrics import Metrics
from gateway.observability.request_metrics import MetricsObserver
from gateway.observability.request_tracing import TracingObserver
from gateway.observability.tenant_labels import TenantLabels
from gateway.observability.tenants import TenantObserver
from gateway.observability.tracing import Tracing
from gateway.proxy.call import Call
from gateway.proxy.dispatch import Dispatcher
from gateway.proxy.handler import ProxyHandler
from gateway.proxy.live import LiveStreams
from gateway.proxy.upstream import UpstreamClient
from gateway.relay.native import resolve
from gateway.rollout.collector import Collector, Samples
from gateway.routing.admission import Admission
from gateway.signals import Signals
from gateway.tls import scheme, server_context
from gateway.units import BitChange, PanicChange, UnitRegistry, UnitState

log = logging.getLogger("unitgate")
LIMITER_CLOSE_S = 5.0  # at stop: the limiter's last flush (leases back, last settles)


@dataclass(frozen=True, slots=True)
class Role:
    """What this process runs. One process runs both halves (`ALL`); with workers, the
    control plane runs the control half and each worker the public one (gateway/workers/).

    `record` takes the breaker evidence the request path classifies (default: this process's
    breakers); `traffic` tells the probers whether a unit's streams flow (default: this
    process's streams); `limit` is the in-flight limit over all units (default: the config's,
    or what the open-files limit allows)."""

    public: bool = True  # the OpenAI API on [gateway].port and the request path
    control: bool = True  # probers, breakers, admin API, operator listener
    reuse_port: bool = False  # the public port is shared with other workers
    record: Record | None = None
    traffic: Traffic | None = None
    # This gateway's requests on a unit, for the probers to tell the leader's count of them
    # from other replicas' (default: the live count; the control plane's is its workers').
    own: Callable[[UnitState], int] | None = None
    limit: int | None = None
    workers: WorkersView | None = None  # the admin API's /admin/workers
    settle: Settle | None = None  # the workers' state caught up with an admin change
    # Each priority class's (waiting, in flight) for the metrics and the status page
    # (default: this process's admission; the control plane's: its workers', as reported).
    by_class: Callable[[], Mapping[str, tuple[int, int]]] | None = None
    # Each unit's learned latency figures (default: this process's forecast; the control
    # plane's: its workers', as reported), for the metrics and the probers' lag verdict.
    latency: Figures | None = None
    # A running rollout's windows, which its driver judges (default: this process's
    # collector; the control plane's: its workers', summed).
    rollout_samples: Samples | None = None


ALL = Role()


class Gateway:
    def __init__(
        self, config: Config, tracer_provider: TracerProvider | None = None, role: Role = ALL
    ) -> None:
        self.config = config
        self.role = role
        self.tracing = Tracing(config.tracing, tracer_provider)
        self.units = UnitRegistry(config)
        a = config.admission
        nodes = sum(len(u.nodes) for u in config.units)
        limit = role.limit or a.max_inflight or stream_budget(nodes)
        self.admission = Admission(
            a.queue_size,
            a.queue_timeout,
            a.retry_after,
            limit,
            config.priority,
            capacity=self.units.capacity,
        )
        self.units.on_change(lambda *_: self.admission.wake_all())
        # The loop's own lag: exported, and consulted by connect deadlines (looplag.py).
        self.lag = LoopLag()
        self.metrics = Metrics(
            self.units,
            lambda: self.admission.queued,
            self.lag,
            config.timeouts.total,
            role.by_class or self.admission.by_class,
        )
        self.events = EventLog(config.admin.events_kept)
        # Health's observers: it emits signals, the metrics and the events log subscribe.
        self.health_signals = health_signals(self.events, self.metrics)
        self.breakers = BreakerGate(config, self.units, self.health_signals)
        # Streams in flight per unit: ejections reach them, and they vouch for a slow unit.
        self.live = LiveStreams(config.health.traffic_window, config.health.pace_factor)
        self.units.on_membership(self._membership)
        self.units.on_panic(lambda change: _log_panic(self.events, change))
        # The request path's observers: it emits signals, these subscribe (gateway/signals.py).
        self.signals: Signals[Call] = Signals()
        self.signals.subscribe(MetricsObserver(self.metrics))
        # What routing knows of the units beyond their health: their caches, their speed.
        self.knowledge = UnitKnowledge(
            config, self.units, self.signals, self.metrics, role.public, role.latency
        )
        self.health = HealthSupervisor(
            config,
            self.units,
            self.health_signals,
            traffic=role.traffic or self.live.flowing,
            own=role.own or live_count,
            lagging=self.knowledge.lagging,
        )
        window, top = TokenWindow(config.metrics.fairness_window), config.metrics.tenants_top
        self.tenants = TenantObserver(self.metrics.tenants, TenantLabels(top), window)
        self.signals.subscribe(self.tenants)
        self.metrics.window = self.tenants.shares
        self.signals.subscribe(AuditObserver(self.events))
        record = role.record or self.breakers.record
        idle, pace = config.timeouts.idle, config.health.pace_factor
        self.signals.subscribe(BreakerFeed(record, self.live.flowing, idle, pace))
        self.signals.subscribe(self.live)  # an answer that opened: its unit serves
        if self.tracing.enabled:
            self.signals.subscribe(TracingObserver(self.tracing))
        access_log.subscribe(self.signals, config.logging)  # only if [logging] access
        # Each revision's answers while a rollout runs, which its gates judge.
        self.rollout_samples = _rollout_samples(self.signals, self.units, role)
        # The data plane's API keys: written by the admin API here, or by the control plane's
        # link in a worker; read by the request path.
        self.keys = KeyRing()
        # Admin API: the one writer of the units' enabled/draining bits. It restores its saved
        # overrides while the operator listener is set up, before any listener opens.
        self.admin: Admin | None = None
        if config.admin.enabled and role.control:
            views = (self.breakers.view, role.workers, self.metrics)
            self.admin = Admin(
                config,
                self.units,
                self.events,
                *views,
                keys=self.keys,
                settle=role.settle,
                latency=self.knowledge.latency_figures,
                samples=self.rollout_samples,
            )
        self.draining = False
        self.public_url = ""
        self.front = ""  # what serves the public listener: "lean" or "aiohttp"
        self.metrics_url = ""
        self._runners: list[web.AppRunner] = []
        # The lean fronts' listeners, with their drain time.
        self._fronts: list[tuple[asyncio.Server, Front, float]] = []
        self._upstream: UpstreamClient | None = None
        self.proxy: ProxyHandler | None = None  # the request path, once started
        self.limiter: Limiter | None = None  # the keys' limits, with the request path

    def _membership(self, unit: UnitState, added: bool) -> None:
        if not added:
            self.live.forget(unit.id)
            self.knowledge.leave(unit.id)
        elif self.role.public and self.proxy is not None:  # else joined as the path starts
            self.knowledge.join(unit.config)

    async def start(self) -> None:
        self.lag.start()
        self.metrics.gc.install()
        g, m = self.config.gateway, self.config.metrics
        if self.role.control:
            self.breakers.start()
            await self.health.start()
        try:
            if self.role.control:
                admin = self.admin
                ops = ops_app(
                    self.metrics,
                    admin.app() if admin is not None else None,
                    admin.status if admin is not None else None,
                )
                tls = server_context(m.tls_cert, m.tls_key)
                self.metrics_url = await self._listen(ops, m.host, m.port, 5.0, tls=tls)
            if self.role.public:
                # Built (or found in the cache) off the loop; the client then finds it loaded.
                _, why = await asyncio.to_thread(resolve, self.config.upstream.relay)
                if why is not None:
                    log.warning("%s", why)
                self._upstream = UpstreamClient(self.config, self.lag)
                dispatcher = Dispatcher(
                    self.config,
                    self.units,
                    self.admission,
                    self._upstream,
                    self.signals,
                    prompts=await self.knowledge.load_prompts(),
                    depths=self.knowledge.depths,
                    forecast=self.knowledge.forecast,
                    turns=self.knowledge.turns,
                )
                gate = Gatekeeper(self.config.auth, self.keys)
                workers = self.config.gateway.worker_count if self.role.reuse_port else 1
                self.limiter = build_limiter(self.config.limits, self.config.state, workers)
                self.limiter.start()
                self.proxy = proxy = ProxyHandler(
                    self.config, dispatcher, self.live, gate, self.limiter
                )
                self.units.on_change(lambda change: _eject_streams(proxy, change))
                for unit in self.units.units.values():
                    self.knowledge.join(unit.config)
                app = public_app(self.config, proxy, self.units, lambda: self.draining)
                self.front = g.front_chosen
                lean = lean_routes(proxy, g.root_path) if self.front == "lean" else None
                self.public_url = await self._listen(
                    app,
                    g.host,
                    g.port,
                    g.shutdown_timeout,
                    self.role.reuse_port,
                    server_context(g.tls_cert, g.tls_key),
                    lean,
                )
        except BaseException:
            await self.stop()
            raise
        if self.role.control and self.role.public:
            log.info(
                "gateway listening on %s (metrics %s/metrics), %d units, at most %d requests"
                " in flight",
                self.public_url,
                self.metrics_url,
                len(self.units.units),
                self.admission.limit,
            )
        elif self.role.public:
            log.info(
                "worker %d listening on %s, at most %d requests in flight",
                os.getpid(),
                self.public_url,
                self.admission.limit,
            )
        else:
            log.info(
                "control plane: metrics and admin on %s, %d units",
                self.metrics_url,
                len(self.units.units),
            )

    async def stop(self) -> None:
        self.draining = True
        fronts, self._fronts = self._fronts, []
        for server, _, _ in fronts:
            server.close()  # no new connection
        await asyncio.gather(*(front.shutdown(drain) for _, front, drain in fronts))
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._upstream is not None:
            await self._upstream.close()
            self._upstream = None
        await self.knowledge.stop()
        if self.limiter is not None:  # after the drain: the last settles go with its flush
            limiter, self.limiter = self.limiter, None
            try:
                async with asyncio.timeout(LIMITER_CLOSE_S):
                    await limiter.close()
            except TimeoutError:
                log.warning("limits: the last flush did not finish in %g s", LIMITER_CLOSE_S)
        await self.health.stop()
        self.breakers.stop()
        self.lag.stop()
        self.metrics.gc.uninstall()
        self.tracing.shutdown()

    async def _listen(
        self,
        app: web.Application,
        host: str,
        port: int,
        drain: float,
        reuse_port: bool = False,
        tls: ssl.SSLContext | None = None,
        lean: Mapping[str, LeanRoute] | None = None,
    ) -> str:
        """Serve `app` on host:port; with `lean` routes, the lean front serves those and
        hands the rest to `app` (gateway/front)."""
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=drain,
            keepalive_timeout=KEEPALIVE_S,
        )
        await runner.setup()
        self._runners.append(runner)
        if lean is None:
            site = web.TCPSite(
                runner, host, port, backlog=LISTEN_BACKLOG, reuse_port=reuse_port, ssl_context=tls
            )
            await site.start()
            host, port = runner.addresses[-1][:2]
            return f"{scheme(tls)}://{host}:{port}"
        assert runner.server is not None
        native = None if self._upstream is None else self._upstream.native
        front = Front(
            lean,
            runner.server,
            keepalive=KEEPALIVE_S,
            cors=bool(self.config.gateway.cors_origins),
            quick=None if native is None else native.request_head,
        )
        server = await asyncio.get_running_loop().create_server(
            front, host, port, backlog=LISTEN_BACKLOG, reuse_port=reuse_port, ssl=tls
        )
        self._fronts.append((server, front, drain))
        host, port = server.sockets[0].getsockname()[:2]
        return f"{scheme(tls)}://{host}:{port}"


@contextlib.asynccontextmanager
async def running(
    config: Config, tracer_provider: TracerProvider | None = None, role: Role = ALL
) -> AsyncIterator[Gateway]:
    """A started gateway for the duration of the block (tests, embedding)."""
    gateway = Gateway(config, tracer_provider, role)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def serve(config: Config, ready_file: Path | None = None) -> None:
    """Run until SIGTERM or SIGINT, then drain."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running(config) as gateway:
        freeze_startup()
        if ready_file is not None:
            write_ready(ready_file, gateway)
        await stop.wait()
        log.info("signal received: draining for up to %g s", config.gateway.shutdown_timeout)
        gateway.draining = True
    log.info("gateway stopped")


def write_ready(path: Path, gateway: Gateway) -> None:
    """The gateway's ready file (gateway/base/readyfile.py): its pid and bound addresses."""
    info = {"pid": os.getpid(), "public": gateway.public_url, "metrics": gateway.metrics_url}
    readyfile.write_ready(path, info)


def _eject_streams(proxy: ProxyHandler, change: BitChange) -> None:
    """A unit the probes declared unhealthy hands over its stalled streams for resumption now
    instead of at the idle timeout (drains and disables let streams finish)."""
    if change.bit == "healthy" and not change.value:
        count = proxy.live.eject(change.unit.id, change.reason or "unhealthy")
        if count:
            log.warning(
                "unit %s ejected: its %d streams break for resumption once quiet by their own"
                " pace (at least %g s without data)",
                change.unit.id,
                count,
                proxy.config.resume.ejected_idle,
            )


def _rollout_samples(signals: Signals[Call], units: UnitRegistry, role: Role) -> Samples | None:
    """Where a rollout's answers are counted: by the request path this process runs, or
    (a control plane) by its workers."""
    if not role.public:
        return role.rollout_samples
    collector = Collector(units)
    signals.subscribe(collector)
    return collector


def _log_panic(events: EventLog, change: PanicChange) -> None:
    """Once per change: panic routing is the fleet-wide cap on what health may take out."""
    what = "panic" if change.active else "panic over"
    events.record(f"model:{change.model}", what, change.reason, "router", logging.WARNING)

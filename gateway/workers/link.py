"""A worker's end of its socket pair: the control plane's state in, traffic's evidence out.

Out go, as they happen: breaker evidence (`outcome`, with its age rather than a time, since
the two processes' loop clocks are not one clock) and events recorded here (a resumption).
Every `REPORT_EVERY` seconds goes a report: which units' streams flow (the probers' reason
to call a unit slow rather than dead) and the in-flight count per unit (the fleet's
"drained") and each priority class's waiting and in-flight counts; every second, and whenever
a /metrics scrape asks, the metrics' samples and the fairness window's tokens per tenant
(fleet.py). Writes
never block the request path: they are buffered by the transport, and a control plane gone
away is seen by the reader as EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.observability import fleet
from gateway.observability.events import Event
from gateway.observability.fairness import Shares
from gateway.proxy.call import Call
from gateway.rollout.collector import Samples
from gateway.signals import Observer
from gateway.units import UnitRegistry, UnitState
from gateway.workers import frames

log = logging.getLogger("unitgate")

REPORT_EVERY = 0.1  # seconds
PROGRESS_KEPT = 10.0  # a unit's last progress older than this is not reported

# (unit id, loop time, enough) -> seconds since the unit last made progress (LiveStreams)
Progressed = Callable[[str, float, float], float | None]
METRICS_EVERY = 10  # reports: the metrics' samples go once a second
ROLLOUT_EVERY = 5  # reports: a running rollout's windows, twice a second (its guards' pace)


class Link(Observer[Call]):
    """Also a request-path observer, for one signal: `ended` counts the requests answered."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.requests = 0
        self.units: UnitRegistry | None = None
        self.flowing_for: Callable[[str, float], float] = lambda _unit, _now: 0.0
        self.latency: Callable[[], Mapping[str, Mapping[str, float]]] = dict
        self.progressed: Progressed = lambda _unit, _now, _enough: None
        self.registry: CollectorRegistry | None = None
        self.by_class: Callable[[], Mapping[str, tuple[int, int]]] = dict
        self.shares: Callable[[], Shares] = dict
        self._reporter: asyncio.Task[None] | None = None
        self._until: dict[str, float] = {}  # unit -> flowing until (this loop's clock)
        self.rollout: Samples | None = None  # the worker's rollout collector
        self._rolling = False  # the last rollout message carried windows

    def attach(
        self,
        units: UnitRegistry,
        flowing_for: Callable[[str, float], float],
        registry: CollectorRegistry,
        by_class: Callable[[], Mapping[str, tuple[int, int]]] = dict,
        shares: Callable[[], Shares] = dict,
        progressed: Progressed | None = None,
        latency: Callable[[], Mapping[str, Mapping[str, float]]] = dict,
        rollout: Samples | None = None,
    ) -> None:
        """What the reports read: the worker's units, how long each one's streams keep
        vouching for it (LiveStreams.flowing_for), its metrics, its admission's classes, its
        fairness window, how long ago each unit last made progress (LiveStreams.progressed),
        each unit's learned latency figures (Forecast.figures), and a running rollout's
        windows (gateway/rollout/collector.py)."""
        self.units, self.flowing_for, self.registry = units, flowing_for, registry
        if progressed is not None:
            self.progressed = progressed
        self.by_class, self.shares = by_class, shares
        self.latency = latency
        self.rollout = rollout

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(frames.encode(message))

    def outcome(self, unit: UnitState, ok: bool, started: float) -> None:
        """The breaker feed's `record`: evidence for the control plane's breakers."""
        age = asyncio.get_running_loop().time() - started
        self.send({"t": "outcome", "unit": unit.id, "ok": ok, "age": age})

    def ended(self, call: Call) -> None:
        self.requests += 1

    def event(self, event: Event) -> None:
        self.send({"t": "event", **event.to_json()})

    def start(self) -> None:
        self._reporter = asyncio.get_running_loop().create_task(self._report())

    async def stop(self) -> None:
        """The last report and metrics, after the streams have drained."""
        if self._reporter is not None:
            self._reporter.cancel()
            await asyncio.gather(self._reporter, return_exceptions=True)
            self._reporter = None
        self.report()
        self.send_metrics()
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()

    def send_metrics(self, scrape: int | None = None) -> None:
        """`scrape`: the number of the control plane's scrape this answers."""
        if self.registry is not None:
            samples = fleet.samples(self.registry)
            found = {"t": "metrics", "samples": samples, "scrape": scrape}
            self.send({**found, "fairness": self.shares(), "latency": self.latency()})

    def send_rollout(self) -> None:
        """A running rollout's windows; once more with none after it ended."""
        windows = None if self.rollout is None else self.rollout.windows()
        if windows is None and not self._rolling:
            return
        self._rolling = windows is not None
        self.send({"t": "rollout", "windows": None if windows is None else windows.wire()})

    def report(self) -> None:
        if self.units is None:
            return
        now = asyncio.get_running_loop().time()
        units = self.units.units.values()
        self.send(
            {
                "t": "report",
                "flowing": {u.id: f for u in units if (f := self._horizon(u.id, now)) > 0},
                "inflight": {u.id: u.inflight for u in units if u.inflight},
                "progress": {
                    u.id: ago
                    for u in units
                    if (ago := self.progressed(u.id, now, REPORT_EVERY)) is not None
                    and ago < PROGRESS_KEPT
                },
                "requests": self.requests,
                "classes": {k: list(v) for k, v in self.by_class().items()},
            }
        )

    def _horizon(self, unit_id: str, now: float) -> float:
        """How long the unit's streams keep vouching. Walking every stream of a unit each
        report would cost 10,000 pace reads per report at 10,000 streams; a horizon already
        known stays true (new data can only extend it), so the streams are walked again only
        when it is about to end."""
        until = self._until.get(unit_id, 0.0)
        if now < until - 2 * REPORT_EVERY:
            return until - now
        horizon = self.flowing_for(unit_id, now)
        self._until[unit_id] = now + horizon
        return horizon

    async def _report(self) -> None:
        count = 0
        while True:
            self.report()
            count += 1
            if count % METRICS_EVERY == 0:
                self.send_metrics()
            if count % ROLLOUT_EVERY == 0:
                self.send_rollout()
            await asyncio.sleep(REPORT_EVERY)

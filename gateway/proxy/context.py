"""What every phase of the request path shares, built once by the handler.

The phases (dispatch, the stream's relay and resumption) take this instead of the handler,
so no phase imports the module above it: the handler sequences the phases, the phases never
reach back into the handler.
"""

from __future__ import annotations

import asyncio

from gateway.config import Config
from gateway.observability.events import EventLog
from gateway.observability.metrics import Metrics
from gateway.proxy.dispatch import Dispatcher
from gateway.proxy.live import LiveStreams
from gateway.proxy.upstream import UpstreamClient
from gateway.routing.admission import Admission


class ProxyContext:
    __slots__ = ("admission", "config", "dispatcher", "events", "live", "metrics", "upstream")

    def __init__(
        self,
        config: Config,
        dispatcher: Dispatcher,
        live: LiveStreams,
        events: EventLog | None = None,
    ) -> None:
        self.config, self.dispatcher, self.live, self.events = config, dispatcher, live, events
        self.admission: Admission = dispatcher.admission
        self.upstream: UpstreamClient = dispatcher.upstream
        self.metrics: Metrics = dispatcher.metrics

    def record_event(self, unit_id: str, what: str, reason: str) -> None:
        if self.events is not None:
            self.events.record(unit_id, what, reason, "gateway")

    def account(self, unit_id: str, status: int, start: float) -> None:
        self.metrics.requests.labels(unit_id, str(status)).inc()
        self.metrics.e2e.labels(unit_id).observe(asyncio.get_running_loop().time() - start)

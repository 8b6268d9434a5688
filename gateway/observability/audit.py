"""The request path's log lines and events, as a subscriber to its signals.

Each transition is logged once: a failed attempt and a stream broken after its first byte as
one warning each; a resumption as one entry in the events log, whose own log line is the only
one (it used to be logged a second time beside it).
"""

from __future__ import annotations

import logging

from gateway.errors import UpstreamError
from gateway.observability.events import EventLog
from gateway.outcomes import End, Resumption
from gateway.proxy.call import Call
from gateway.signals import Observer
from gateway.units import UnitState

log = logging.getLogger("unitgate.proxy")


class AuditObserver(Observer[Call]):
    def __init__(self, events: EventLog | None) -> None:
        self.events = events

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        extra = {"request_id": call.rid, "unit": unit.id, "failure": error.kind.value}
        log.warning("attempt failed: %s", error.detail, extra=extra)

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        if end is not End.COMPLETE and end is not End.CLIENT_GONE:
            extra = {"request_id": call.rid, "unit": unit.id, "end": end.value}
            log.warning(
                "stream from unit %s broke after the first byte: %s", unit.id, end, extra=extra
            )

    def resumed(self, call: Call, broken: UnitState, outcome: Resumption, detail: str) -> None:
        what, reason = f"resume_{outcome}", f"request {call.rid}: {detail}"
        if self.events is not None:
            self.events.record(broken.id, what, reason, "gateway")
        else:
            log.info("unit %s: %s (%s)", broken.id, what, reason)

"""Probing one /health endpoint at a fixed rate over a keep-alive connection, like the
gateway's prober, on a thread of its own: a slow endpoint must not delay the other's probes,
or its slowness would leak into the other's numbers."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field

DEADLINE_S = 2.0


@dataclass(frozen=True, slots=True)
class Probe:
    at_s: float  # since the prober started
    latency_s: float | None  # None: no answer within the deadline, or no connection
    outcome: str  # "ok", "timeout", "error", or "status NNN"
    pending: int | None  # the leader's queue when it answered: evidence of saturation
    step: int | None


@dataclass
class Prober:
    port: int
    rate_hz: float
    offset_s: float = 0.0  # the two probers alternate: one starts half a period later
    probes: list[Probe] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"probe-{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> list[Probe]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(DEADLINE_S + 1.0)
        return self.probes

    def _run(self) -> None:
        """Probe slots are fixed in time; a probe that overran its slot skips the missed ones
        instead of firing a burst to catch up."""
        period, started = 1.0 / self.rate_hz, time.monotonic()
        conn: http.client.HTTPConnection | None = None
        slot = 0
        while not self._stop.wait(
            max(0.0, started + self.offset_s + slot * period - time.monotonic())
        ):
            conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=DEADLINE_S)
            probe, keep = _probe(conn, time.monotonic() - started)
            self.probes.append(probe)
            if not keep:
                conn.close()
                conn = None
            slot = max(slot + 1, int((time.monotonic() - started - self.offset_s) / period) + 1)
        if conn is not None:
            conn.close()


def _probe(conn: http.client.HTTPConnection, at_s: float) -> tuple[Probe, bool]:
    """One GET /health; the connection is kept unless the probe failed (a late answer would
    otherwise be read as the next probe's)."""
    t0 = time.perf_counter()
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
    except TimeoutError:
        return Probe(at_s, None, "timeout", None, None), False
    except (OSError, http.client.HTTPException):
        return Probe(at_s, None, "error", None, None), False
    latency = time.perf_counter() - t0
    if latency > DEADLINE_S:
        return Probe(at_s, None, "timeout", None, None), False
    try:
        fields = json.loads(body)
    except ValueError:
        fields = {}
    outcome = "ok" if resp.status == 200 else f"status {resp.status}"
    return Probe(at_s, latency, outcome, fields.get("pending"), fields.get("step")), True

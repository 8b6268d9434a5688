"""What the workers' reports say, merged as one process would know it.

Each worker reports every REPORT_EVERY seconds: per unit, its in-flight count and how long its
streams keep vouching for the unit by the pace rule, its requests answered, and its priority
classes' queues. The control plane (pool.py) keeps the latest of each here; the probers and
the metrics read the merged view.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from gateway.units import UnitState
from gateway.workers.link import REPORT_EVERY
from gateway.workers.rollout_samples import FleetSamples

DUE_AFTER = 3 * REPORT_EVERY  # seconds after a report by which the next one is late
SILENT_AFTER = 10.0  # seconds without a report after which a worker vouches for nothing
PEAK_S = 0.5  # how far back the probers' own count of this gateway's requests looks


class Reports:
    """The workers' latest reports, merged: the probers' `traffic` and the units' in-flight
    counts, as one process would know them.

    A worker reports, per unit, for how long its streams keep vouching by the pace rule if no
    more data came (`horizon`). While its reports come on time the control plane counts that
    down. When the next one is late, the worker's own loop is behind, and so are its reads of
    the streams' data: in one process the prober would be behind with it, so here the count
    stops where the report was due (a 10,000-stream wave lags a worker's loop by seconds,
    while young streams vouch for only the 1 s floor). A worker silent for `SILENT_AFTER`
    (hung: a dead one closes its link and is forgotten at once) vouches for nothing."""

    def __init__(self) -> None:
        # (when, unit -> the workers' summed in-flight count then), over the last PEAK_S
        self._sums: deque[tuple[float, dict[str, int]]] = deque()
        # worker -> (when its report came, unit -> horizon in seconds)
        self._flowing: dict[int, tuple[float, dict[str, float]]] = {}
        # worker -> unit -> when (this loop's clock) the unit last made progress, as reported
        self._progress: dict[int, dict[str, float]] = {}
        self._inflight: dict[int, dict[str, int]] = {}
        self._summed: dict[str, int] = {}  # unit -> the workers' in-flight count, summed now
        self.requests: dict[int, int] = {}  # answered by each worker's current process
        self._classes: dict[int, dict[str, tuple[int, int]]] = {}  # class -> (waiting, held)
        self.rollout = FleetSamples()  # a running rollout's windows, as the workers sent them

    def update(self, index: int, now: float, message: dict[str, Any]) -> None:
        self._flowing[index] = (now, {str(u): float(f) for u, f in message["flowing"].items()})
        progress = message.get("progress", {})
        self._progress[index] = {str(u): now - float(ago) for u, ago in progress.items()}
        self._inflight[index] = {str(k): int(v) for k, v in message["inflight"].items()}
        self.requests[index] = int(message["requests"])
        classes = message.get("classes", {})
        self._classes[index] = {str(k): (int(w), int(h)) for k, (w, h) in classes.items()}
        self._sum()
        self._sums.append((now, self._summed))
        while self._sums and self._sums[0][0] < now - PEAK_S:
            self._sums.popleft()

    def forget(self, index: int) -> None:
        """The worker exited: its streams are gone with it."""
        self._flowing.pop(index, None)
        self._progress.pop(index, None)
        self._inflight.pop(index, None)
        self.requests.pop(index, None)
        self._classes.pop(index, None)
        self.rollout.forget(index)
        self._sum()

    def _sum(self) -> None:
        """Once per change, for `inflight` and `peak` both (a new dict: `_sums` keeps the
        old ones)."""
        sums: dict[str, int] = {}
        for counts in self._inflight.values():
            for unit, n in counts.items():
                sums[unit] = sums.get(unit, 0) + n
        self._summed = sums

    def flowing(self, unit_id: str, now: float, since: float | None = None) -> bool:
        """As LiveStreams.flowing, over the workers' latest reports."""
        if since is not None:
            return any(p.get(unit_id, -1.0) >= since for p in self._progress.values())
        for at, horizons in self._flowing.values():
            silence = now - at
            if silence < SILENT_AFTER and horizons.get(unit_id, 0.0) > min(silence, DUE_AFTER):
                return True
        return False

    def by_class(self) -> dict[str, tuple[int, int]]:
        """Each priority class's (waiting, in flight), summed over the workers' reports."""
        out: dict[str, tuple[int, int]] = {}
        for classes in list(self._classes.values()):
            for klass, (waiting, held) in classes.items():
                w, h = out.get(klass, (0, 0))
                out[klass] = (w + waiting, h + held)
        return out

    def inflight(self, unit_id: str) -> int:
        return self._summed.get(unit_id, 0)

    def peak(self, unit: UnitState) -> int:
        """The most this gateway's workers had in flight on `unit` over the last PEAK_S, as
        the probers subtract it from the leader's count: a report is up to REPORT_EVERY old,
        and during a burst a stale sum would make the leader's count of this gateway's own
        requests look like other replicas' (and route the burst away from that unit). The
        peak errs the other way: the others' load is underestimated, never invented."""
        return max([unit.inflight, *(sums.get(unit.id, 0) for _, sums in self._sums)])

    def own(self, index: int) -> dict[str, int]:
        """Worker `index`'s in-flight counts, as its last report said."""
        return self._inflight.get(index, {})

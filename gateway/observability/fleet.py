"""Many processes' counters and histograms as one /metrics: the workers' request metrics,
summed into the control plane's own.

Aggregated in the control plane rather than with prometheus_client's multiprocess mode: that
mode covers only prometheus_client's own metric types (not this project's lock-free
histograms or scrape-time collectors) and puts a memory-mapped file write on every counter
increment of the request path. Here a worker sends its cumulative samples once a second,
when a scrape asks (pool.refresh) and when it stops; the control plane keeps each worker's
latest, and when a worker exits, folds
them into a retired total, so a counter never goes backwards across a restart (a worker killed
outright loses at most its last second).

Only counters and histograms are summed: gauges describe state the control plane holds itself.
The exception is each process's own metrics (`process_*`: CPU, memory, file descriptors),
which are not summed but shown per process: the control plane's own without a `worker` label,
each worker's latest with its index as `worker` (gone when it exits; a restarted worker's
CPU counter starts again from 0, which Prometheus' `rate()` reads as a reset).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from gateway.observability.fairness import Shares, from_wire
from gateway.observability.latency_metrics import merged_figures

SUMMED = ("counter", "histogram")
PER_PROCESS = "process_"  # families shown per worker, never summed (process.py)
Key = tuple[str, str, tuple[tuple[str, str], ...]]  # (family, sample name, labels)
# one sample on the wire: [family, type, documentation, sample name, labels, value]
Wire = list[Any]


def samples(registry: CollectorRegistry) -> list[Wire]:
    """A worker's cumulative counter and histogram samples (not their `_created` stamps), and
    its process metrics."""
    out: list[Wire] = []
    for family in registry.collect():
        if family.type not in SUMMED and not family.name.startswith(PER_PROCESS):
            continue
        for s in family.samples:
            if not s.name.endswith("_created"):
                wire = [family.name, family.type, family.documentation, s.name, s.labels]
                out.append([*wire, s.value])
    return out


class Fleet:
    def __init__(self) -> None:
        self._latest: dict[int, dict[Key, float]] = {}
        self._processes: dict[int, dict[Key, float]] = {}  # each worker's process_*, labelled
        self._retired: dict[Key, float] = {}
        self._families: dict[str, tuple[str, str]] = {}  # name -> (type, documentation)
        # each worker's tokens per tenant per class over the fairness window, as it last sent
        # them: a window, not a count, so a retired worker's are dropped, not summed
        self._shares: dict[int, Shares] = {}
        # each worker's units' latency figures as it last sent them (Forecast.figures)
        self._latency: dict[int, dict[str, dict[str, float]]] = {}

    def family(self, name: str) -> tuple[str, str]:
        """(type, documentation) of a family a worker reported."""
        return self._families[name]

    def update(self, worker: int, wire: Iterable[Wire]) -> None:
        latest: dict[Key, float] = {}
        processes: dict[Key, float] = {}
        for family, kind, doc, name, labels, value in wire:
            self._families.setdefault(family, (kind, doc))
            if family.startswith(PER_PROCESS):
                labelled = tuple(sorted({**labels, "worker": str(worker)}.items()))
                processes[(family, name, labelled)] = float(value)
            else:
                latest[(family, name, tuple(sorted(labels.items())))] = float(value)
        self._latest[worker] = latest
        self._processes[worker] = processes

    def update_shares(self, worker: int, wire: dict[str, dict[str, float]]) -> None:
        self._shares[worker] = from_wire(wire)

    def update_latency(self, worker: int, wire: dict[str, dict[str, float]]) -> None:
        self._latency[worker] = {
            str(unit): {str(k): float(v) for k, v in figures.items()}
            for unit, figures in wire.items()
        }

    def latency(self) -> dict[str, dict[str, float]]:
        """The units' latency figures as the workers' forecasts learned them, merged."""
        return merged_figures(list(self._latency.values()))

    def shares(self) -> list[Shares]:
        """The listening workers' fairness windows (fairness.merged sums them)."""
        return list(self._shares.values())

    def retire(self, worker: int) -> None:
        """The worker exited: what it counted stays counted; its process metrics and its
        fairness window go."""
        self._processes.pop(worker, None)
        self._shares.pop(worker, None)
        self._latency.pop(worker, None)
        for key, value in self._latest.pop(worker, {}).items():
            self._retired[key] = self._retired.get(key, 0.0) + value

    def totals(self) -> dict[Key, float]:
        total = dict(self._retired)
        for latest in list(self._latest.values()):
            for key, value in latest.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def processes(self) -> dict[Key, float]:
        """Every listening worker's latest process metrics, each with its `worker` label."""
        out: dict[Key, float] = {}
        for latest in list(self._processes.values()):
            out.update(latest)
        return out

    def merged(self, own: CollectorRegistry) -> _Merged:
        return _Merged(own, self)


class _Merged(CollectorRegistry):
    """What generate_latest reads: the control plane's families with the workers' sums
    added, and families only workers have appended."""

    def __init__(self, own: CollectorRegistry, fleet: Fleet) -> None:
        super().__init__(auto_describe=False)
        self.own, self.fleet = own, fleet

    def collect(self) -> Iterator[Metric]:
        by_family: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        fleet = self.fleet
        for (family_name, name, labels), value in (fleet.totals() | fleet.processes()).items():
            by_family.setdefault(family_name, {})[(name, labels)] = value
        for family in self.own.collect():
            extra = by_family.pop(family.name, None)
            yield family if extra is None else _add(family, extra)
        for name, extra in by_family.items():
            kind, doc = self.fleet.family(name)
            yield _add(Metric(name, doc, kind), extra)


def _add(family: Metric, extra: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> Metric:
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for s in family.samples:
        if not s.name.endswith("_created"):
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for key, value in extra.items():
        values[key] = values.get(key, 0.0) + value
    merged = Metric(family.name, family.documentation, family.type)
    for (name, labels), value in values.items():
        merged.add_sample(name, dict(labels), value)
    return merged

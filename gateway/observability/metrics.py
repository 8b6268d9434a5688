"""The gateway's Prometheus metrics, one registry per gateway instance.

Gauges that mirror state the gateway already keeps (in-flight per unit, queue depth,
routability) are read at scrape time by a collector instead of being updated on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.observability.histogram import HistogramFamily
from gateway.units import UnitRegistry


class Metrics:
    def __init__(self, units: UnitRegistry, queue_depth: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "unitgate_requests",
            "Requests answered, by serving unit and HTTP status.",
            ["unit", "status"],
            registry=r,
        )
        self.retries = Counter(
            "unitgate_retries",
            "Requests re-sent to another unit, by failure kind.",
            ["kind"],
            registry=r,
        )
        self.budget_exhausted = Counter(
            "unitgate_retry_budget_exhausted",
            "Retries refused because the retry budget was spent.",
            registry=r,
        )
        self.cancellations = Counter(
            "unitgate_cancellations",
            "Requests whose client went away before the answer ended.",
            ["unit"],
            registry=r,
        )
        self.upstream_failures = Counter(
            "unitgate_upstream_failures",
            "Failed attempts at a unit, by kind.",
            ["unit", "kind"],
            registry=r,
        )
        self.rejections = Counter(
            "unitgate_admission_rejections",
            "Requests refused by admission control.",
            ["reason"],
            registry=r,
        )
        self.ttft = HistogramFamily(
            "unitgate_time_to_first_token_seconds",
            "Request arrival to first body byte sent.",
            "unit",
        )
        self.itl = HistogramFamily(
            "unitgate_inter_token_latency_seconds", "Time between relayed stream chunks.", "unit"
        )
        self.e2e = HistogramFamily(
            "unitgate_request_duration_seconds", "Request arrival to the end of the answer.", "unit"
        )
        for family in (self.ttft, self.itl, self.e2e):
            r.register(family)
        r.register(_StateCollector(units, queue_depth))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, units: UnitRegistry, queue_depth: Callable[[], int]) -> None:
        self.units = units
        self.queue_depth = queue_depth

    def collect(self) -> Iterator[GaugeMetricFamily]:
        inflight = GaugeMetricFamily(
            "unitgate_unit_inflight", "Requests in flight per unit.", labels=["unit"]
        )
        routable = GaugeMetricFamily(
            "unitgate_unit_routable", "1 when the unit may take new requests.", labels=["unit"]
        )
        for unit in self.units.units.values():
            inflight.add_metric([unit.id], unit.inflight)
            routable.add_metric([unit.id], 1.0 if unit.routable else 0.0)
        yield inflight
        yield routable
        yield GaugeMetricFamily(
            "unitgate_queue_depth", "Requests waiting for a unit slot.", value=self.queue_depth()
        )

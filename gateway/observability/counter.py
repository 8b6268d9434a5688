"""A lock-free counter family for the counters every request increments.

prometheus_client's Counter takes a lock on each increment and runs three Python calls
around it (about 1.5 us); the request path increments four to six of them per request. The
gateway increments them on its one event loop thread, so a plain float addition does: the
children are exported at scrape time, as prometheus_client's would be (`_total` and
`_created` per label set).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry


class CounterChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counters only go up: inc({amount!r})")
        self.value += amount


class CounterFamily(Collector):
    """One counter per label values; callers on the request path keep the children."""

    def __init__(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labels)
        self.children: dict[tuple[str, ...], CounterChild] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: labels {self.labelnames}, got {values}")
            child = self.children[values] = CounterChild()
        return child

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.doc, labels=list(self.labelnames))
        # sorted() copies the items in one C call, safe while the loop thread adds children.
        for values, child in sorted(self.children.items()):
            family.add_metric(list(values), child.value, created=child.created)
        yield family

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [CounterMetricFamily(self.name, self.doc, labels=list(self.labelnames))]

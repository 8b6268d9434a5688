"""Per-tenant metrics, as a subscriber to the request path's signals, and the fairness index.

Three counter families, their `tenant` label bounded by `[metrics].tenants_top` (plus
"other", tenant_labels.py): requests answered by class and status, tokens by class and type,
and refusals by reason. Counters, not gauges: with `[gateway].workers > 1` the control plane
sums the workers' (fleet.py). The fairness gauge is read at scrape from the tokens each
tenant was served lately (fairness.py), every tenant's, labelled or not.

What one request costs here: at its end, the label assigner's dict lookup (tenant_labels.py),
one dict lookup for its (tenant, class, status) counter and, with usage, one for its
(tenant, class) token counters; one dict update in the fairness window at admission and at
the end. `.labels()` runs once per new combination, not per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.observability.counter import CounterChild, CounterFamily
from gateway.observability.fairness import Shares, TokenWindow, index
from gateway.observability.tenant_labels import OTHER, TenantLabels
from gateway.proxy.call import Call
from gateway.signals import Observer

Child = CounterChild  # a labelled child, as .labels() returns it


class TenantFamilies:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        # Incremented by every request: lock-free (counter.py).
        self.requests = CounterFamily(
            "unitgate_tenant_requests",
            "Requests answered, by tenant (the top [metrics].tenants_top, else 'other'),"
            " priority class and HTTP status.",
            ["tenant", "class", "status"],
            registry=r,
        )
        self.tokens = CounterFamily(
            "unitgate_tenant_tokens",
            "Tokens served, by tenant (top N, else 'other'), priority class and type (prompt,"
            " completion), as the answers' usage says.",
            ["tenant", "class", "type"],
            registry=r,
        )
        self.rejections = Counter(
            "unitgate_tenant_rejections",
            "Requests refused by admission control, by tenant (top N, else 'other') and reason"
            " (saturated: 429).",
            ["tenant", "reason"],
            registry=r,
        )
        self.rejections.labels(OTHER, "saturated")  # at 0 from the start, for increase()


class TenantObserver(Observer[Call]):
    def __init__(
        self,
        families: TenantFamilies,
        labels: TenantLabels,
        window: TokenWindow,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.f, self.labels, self.window, self.clock = families, labels, window, clock
        self._requests: dict[tuple[str, str, int], Child] = {}
        self._tokens: dict[tuple[str, str], tuple[Child, Child]] = {}
        self._rejections: dict[tuple[str, str], Counter] = {}

    def shares(self) -> Shares:
        """Tokens per tenant per class over the fairness window, as of now."""
        return self.window.shares(self.clock())

    def admitted(self, call: Call, waited: float) -> None:
        ask = call.lease.ask
        self.window.add(self.clock(), ask.klass, ask.tenant)

    def rejected(self, call: Call, code: str) -> None:
        ask = call.lease.ask
        self.window.add(self.clock(), ask.klass, ask.tenant)
        key = (self.labels.label(call.caller.tenant), code)
        child = self._rejections.get(key)
        if child is None:
            child = self._rejections[key] = self.f.rejections.labels(*key)
        child.inc()

    def ended(self, call: Call) -> None:
        status = call.status
        if status is None:
            return
        tenant, klass = call.caller.tenant, call.lease.ask.klass
        label = self.labels.observe(tenant)
        key = (label, klass, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.f.requests.labels(label, klass, str(status))
        child.inc()
        usage = call.usage
        if usage is not None:
            prompt, completion = self._token_children(label, klass)
            prompt.inc(usage.prompt)
            completion.inc(usage.completion)
            self.window.add(self.clock(), klass, tenant, usage.prompt + usage.completion)
        elif status == 200:  # served, its usage unreported: the estimate admission charged
            self.window.add(self.clock(), klass, tenant, call.lease.ask.tokens)

    def _token_children(self, label: str, klass: str) -> tuple[Child, Child]:
        children = self._tokens.get((label, klass))
        if children is None:
            tokens = self.f.tokens
            prompt = tokens.labels(label, klass, "prompt")
            children = (prompt, tokens.labels(label, klass, "completion"))
            self._tokens[(label, klass)] = children
        return children


class FairnessCollector(Collector):
    """`unitgate_class_fairness`, computed at scrape from `shares` (this process's window,
    and in a control plane its workers' too)."""

    def __init__(self, shares: Callable[[], Shares]) -> None:
        self.shares = shares

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "unitgate_class_fairness",
            "Jain's fairness index, per priority class, over the tokens each tenant that asked"
            " was served in the last [metrics].fairness_window seconds: 1 = equal shares,"
            " 1/n = one tenant of n got everything.",
            labels=["class"],
        )
        for klass, value in sorted(index(self.shares()).items()):
            family.add_metric([klass], value)
        yield family

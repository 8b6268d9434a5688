"""The per-tenant counters and the fairness gauge, fed by the observer's signals (no request
path: calls are built and their ends signalled directly)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.auth.caller import Caller
from gateway.observability.fairness import TokenWindow
from gateway.observability.tenant_labels import MIN_REQUESTS, TenantLabels
from gateway.observability.tenants import FairnessCollector, TenantFamilies, TenantObserver
from gateway.paths import COMPLETIONS_PATH
from gateway.proxy.call import Call
from gateway.proxy.lease import Lease
from gateway.relay.usage import Usage
from gateway.routing.admission import Admission, Ask


class Clock:
    now = 10.0

    def __call__(self) -> float:
        return self.now


def call(tenant: str, klass: str, status: int | None, usage: Usage | None = None) -> Call:
    c = Call(COMPLETIONS_PATH, "r1", {}, 0.0, 60.0, Lease(Admission(8, 1.0, 1)))
    c.caller = Caller(tenant, f"k-{tenant}", None, "")
    c.lease.ask = Ask(klass, tenant, 50)
    c.status, c.usage = status, usage
    return c


def observer(top: int = 2) -> tuple[TenantObserver, CollectorRegistry]:
    registry = CollectorRegistry()
    o = TenantObserver(TenantFamilies(registry), TenantLabels(top), TokenWindow(), Clock())
    registry.register(FairnessCollector(o.shares))
    return o, registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_requests_tokens_and_refusals_are_counted_under_the_tenants_label() -> None:
    o, r = observer()
    for _ in range(MIN_REQUESTS + 2):
        o.ended(call("acme", "batch", 200, Usage(3, 7)))
    refused = call("acme", "batch", 429)
    o.rejected(refused, "saturated")
    o.ended(refused)
    assert (
        value(
            r, "unitgate_tenant_requests_total", tenant="acme", **{"class": "batch"}, status="200"
        )
        == 3
    )  # promoted at its tenth request
    assert (
        value(
            r, "unitgate_tenant_requests_total", tenant="other", **{"class": "batch"}, status="200"
        )
        == MIN_REQUESTS - 1
    )
    assert (
        value(
            r, "unitgate_tenant_requests_total", tenant="acme", **{"class": "batch"}, status="429"
        )
        == 1
    )
    assert (
        value(
            r,
            "unitgate_tenant_tokens_total",
            tenant="acme",
            **{"class": "batch"},
            type="completion",
        )
        == 21
    )
    assert value(r, "unitgate_tenant_rejections_total", tenant="acme", reason="saturated") == 1


def test_unlabelled_tenants_are_other_and_the_label_count_is_bounded() -> None:
    o, r = observer(top=1)
    for i in range(30):
        o.ended(call("big", "standard", 200))
        o.ended(call(f"small{i}", "standard", 200))
    tenants = {
        s.labels["tenant"]
        for family in r.collect()
        if family.name == "unitgate_tenant_requests"
        for s in family.samples
    }
    assert tenants == {"big", "other"}


def test_the_fairness_gauge_reads_every_tenants_tokens_labelled_or_not() -> None:
    o, r = observer(top=0)  # no labels at all: fairness still sees each tenant
    o.ended(call("a", "batch", 200, Usage(50, 50)))
    o.ended(call("b", "batch", 200, Usage(50, 50)))
    o.ended(call("c", "interactive", 200, Usage(90, 10)))
    refused = call("d", "interactive", 429)
    o.rejected(refused, "saturated")
    o.ended(refused)
    assert value(r, "unitgate_class_fairness", **{"class": "batch"}) == 1.0
    assert value(r, "unitgate_class_fairness", **{"class": "interactive"}) == 0.5


def test_a_served_answer_without_usage_counts_its_estimate_toward_fairness() -> None:
    o, _ = observer()
    o.ended(call("a", "batch", 200))
    o.ended(call("b", "batch", 503))
    assert o.shares() == {"batch": {"a": 50.0}}

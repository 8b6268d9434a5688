"""The status page's classes and tenants: waits, refusals, fairness and each tenant's rates,
from the gateway's real metrics objects (no request path: counters are set directly)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.observability.fleet import Fleet, samples
from gateway.observability.metrics import Metrics
from gateway.status.classes import ClassesAndTenants, Increase
from gateway.units import UnitRegistry
from tests.support import gateway_config


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def metrics(held: dict[str, tuple[int, int]] | None = None) -> Metrics:
    return Metrics(UnitRegistry(gateway_config([])), lambda: 0, by_class=lambda: held or {})


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


def test_increase_is_the_growth_since_the_oldest_reading_in_the_window() -> None:
    inc = Increase(window_s=5.0)
    assert inc.update(0.0, {key("a"): 1.0}) == (0.0, {key("a"): 0.0})
    assert inc.update(2.0, {key("a"): 5.0, key("b"): 2.0}) == (2.0, {key("a"): 4.0, key("b"): 2.0})
    inc.update(6.0, {key("a"): 9.0})
    # the oldest kept is the newest at least 5 s old (t = 2); a count that went down is 0
    assert inc.update(8.0, {key("a"): 3.0}) == (6.0, {key("a"): 0.0})


def snapshot(view: ClassesAndTenants) -> dict[str, Any]:
    found: dict[str, Any] = {}
    view.annotate(found)
    return found


def test_classes_show_waiting_in_flight_wait_quantiles_refusals_and_fairness() -> None:
    m, clock = metrics({"batch": (4, 2), "interactive": (0, 1)}), Clock()
    m.window = lambda: {"batch": {"a": 30.0, "b": 10.0}}
    view = ClassesAndTenants(m, clock)
    snapshot(view)
    for wait in [0.01] * 98 + [2.0, 2.0]:
        m.queue_wait.labels("batch").observe(wait)
    m.class_rejections.labels("batch", "saturated").inc(6)
    clock.now += 2.0
    rows = {row["name"]: row for row in snapshot(view)["classes"]}
    batch, interactive = rows["batch"], rows["interactive"]
    assert (batch["waiting"], batch["in_flight"]) == (4, 2)
    assert batch["wait_p50"] <= 0.025 and 1.0 < batch["wait_p99"] <= 2.5
    assert batch["refused_per_s"] == pytest.approx(3.0)
    assert batch["fairness"] == pytest.approx(40**2 / (2 * (30**2 + 10**2)))
    assert interactive == {
        "name": "interactive",
        "waiting": 0,
        "in_flight": 1,
        "wait_p50": None,
        "wait_p99": None,
        "refused_per_s": 0.0,
        "fairness": None,
    }


def test_tenants_show_rates_429s_and_class_mix_busiest_first() -> None:
    m, clock = metrics(), Clock()
    view = ClassesAndTenants(m, clock)
    t = m.tenants
    t.requests.labels("idle", "batch", "200").inc(5)
    snapshot(view)
    t.requests.labels("acme", "batch", "200").inc(6)
    t.requests.labels("acme", "interactive", "200").inc(2)
    t.requests.labels("acme", "batch", "429").inc(2)
    t.tokens.labels("acme", "batch", "completion").inc(100)
    t.rejections.labels("acme", "saturated").inc(2)
    t.requests.labels("other", "batch", "200").inc(4)
    clock.now += 2.0
    rows = snapshot(view)["tenants"]
    assert [row["tenant"] for row in rows] == ["acme", "other"]  # idle: nothing lately
    acme = rows[0]
    assert acme["rps"] == pytest.approx(5.0)
    assert acme["tokens_per_s"] == pytest.approx(50.0)
    assert acme["refused_per_s"] == pytest.approx(1.0)
    assert acme["classes"] == {"batch": pytest.approx(4.0), "interactive": pytest.approx(1.0)}


def test_a_control_plane_shows_its_workers_tenants_classes_and_fairness() -> None:
    worker = metrics()
    plane, clock = metrics({"batch": (3, 1)}), Clock()
    plane.fleet = Fleet()
    view = ClassesAndTenants(plane, clock)
    snapshot(view)
    worker.tenants.requests.labels("acme", "batch", "200").inc(6)
    worker.queue_wait.labels("batch").observe(0.5)
    plane.fleet.update(0, samples(worker.registry))
    plane.fleet.update_shares(0, {"batch": {"acme": 10.0, "b": 0.0}})
    clock.now += 3.0
    found = snapshot(view)
    assert found["tenants"][0]["tenant"] == "acme"
    assert found["tenants"][0]["rps"] == pytest.approx(2.0)
    batch = found["classes"][0]
    assert (batch["waiting"], batch["in_flight"], batch["fairness"]) == (3, 1, 0.5)
    assert batch["wait_p50"] is not None

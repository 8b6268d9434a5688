"""The status page's traffic per unit: rates and TTFT quantiles over a window of readings,
from the gateway's real metrics objects (no request path: the counters are set directly)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.observability.fleet import Fleet, samples
from gateway.observability.metrics import Metrics
from gateway.status.traffic import Reading, Traffic, Window, quantile, readings
from gateway.units import UnitRegistry
from tests.support import gateway_config


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def metrics() -> Metrics:
    unit = {"id": "u0", "leader": "http://127.0.0.1:9", "nodes": ["http://127.0.0.1:9"]}
    return Metrics(UnitRegistry(gateway_config([unit])), lambda: 0)


def test_quantile_interpolates_within_its_bucket_like_histogram_quantile() -> None:
    cumulative = {0.1: 0.0, 0.2: 50.0, 0.5: 100.0, math.inf: 100.0}
    assert quantile(0.5, cumulative) == pytest.approx(0.2)
    assert quantile(0.25, cumulative) == pytest.approx(0.15)
    assert quantile(0.99, cumulative) == pytest.approx(0.2 + 0.3 * 49 / 50)
    assert quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None  # nothing observed
    assert quantile(0.99, {1.0: 1.0, math.inf: 10.0}) == 1.0  # beyond the last bound


def test_readings_sum_over_other_labels_and_skip_requests_without_a_unit() -> None:
    got = readings(
        [
            ("r_total", {"unit": "u0", "status": "200", "model": "a"}, 7.0),
            ("r_total", {"unit": "u0", "status": "503", "model": "b"}, 2.0),
            ("r_total", {"unit": "none", "status": "429"}, 5.0),
            ("t_total", {"unit": "u0", "type": "completion"}, 40.0),
            ("t_total", {"unit": "u0", "type": "prompt"}, 10.0),
            ("h_bucket", {"unit": "u0", "le": "0.5"}, 3.0),
            ("h_bucket", {"unit": "u0", "le": "+Inf"}, 4.0),
            ("h_sum", {"unit": "u0"}, 1.5),
        ],
        "r",
        "t",
        "h",
    )
    assert set(got) == {"u0"}
    u0 = got["u0"]
    assert (u0.requests, u0.errors, u0.completion, u0.prompt) == (9.0, 2.0, 40.0, 10.0)
    assert u0.ttft == {0.5: 3.0, math.inf: 4.0}


def test_the_window_reports_rates_since_its_oldest_reading_and_forgets_old_ones() -> None:
    window = Window(window_s=5.0)
    assert window.update(0.0, {"u0": Reading(requests=0)}) is None  # no baseline yet
    rates = window.update(2.0, {"u0": Reading(requests=10, completion=100)})
    assert rates is not None
    assert rates["u0"]["rps"] == pytest.approx(5.0)
    assert rates["u0"]["tokens_per_s"] == pytest.approx(50.0)
    for t in (4.0, 6.0, 8.0):
        rates = window.update(t, {"u0": Reading(requests=10 + 10 * t)})
    # The oldest kept is the newest at least 5 s old (t = 2): (90 - 10) requests in 6 s.
    assert rates is not None and rates["u0"]["rps"] == pytest.approx(80 / 6)
    assert window.update(9.0, {"u0": Reading(requests=0)})["u0"]["rps"] == 0.0  # type: ignore[index]


def test_traffic_annotates_each_unit_from_the_live_metrics() -> None:
    m, clock = metrics(), Clock()
    traffic = Traffic(m, clock)
    snapshot: dict[str, Any] = {"units": [{"id": "u0"}, {"id": "u9"}]}
    traffic.annotate(snapshot)
    assert "traffic" not in snapshot["units"][0]  # one reading only
    m.requests.labels("u0", "m", "200").inc(20)
    m.tokens.labels("u0", "m", "completion").inc(400)
    for ttft in [0.02] * 19 + [3.0]:
        m.ttft.labels("u0", "m").observe(ttft)
    clock.now += 2.0
    snapshot = {"units": [{"id": "u0"}, {"id": "u9"}]}
    traffic.annotate(snapshot)
    u0, u9 = snapshot["units"]
    assert u0["traffic"]["rps"] == pytest.approx(10.0)
    assert u0["traffic"]["tokens_per_s"] == pytest.approx(200.0)
    assert 0.01 < u0["traffic"]["ttft_p50"] <= 0.025
    assert 2.5 < u0["traffic"]["ttft_p99"] <= 5.0
    assert u9["traffic"] == {**u9["traffic"], "rps": 0.0, "ttft_p50": None}
    assert snapshot["traffic_window_s"] == 5.0


def test_a_control_plane_counts_its_workers_requests() -> None:
    worker, plane, clock = metrics(), metrics(), Clock()
    plane.fleet = Fleet()
    traffic = Traffic(plane, clock)
    traffic.annotate({"units": []})
    worker.requests.labels("u0", "m", "200").inc(6)
    plane.fleet.update(1, samples(worker.registry))
    clock.now += 3.0
    snapshot: dict[str, Any] = {"units": [{"id": "u0"}]}
    traffic.annotate(snapshot)
    assert snapshot["units"][0]["traffic"]["rps"] == pytest.approx(2.0)

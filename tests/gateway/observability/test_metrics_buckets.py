"""Latency buckets derived from `[timeouts].total`, and histograms labelled by unit and model."""

from __future__ import annotations

import pytest

from gateway.observability.histogram import LATENCY_BUCKETS, Histogram, HistogramFamily, reaching


@pytest.mark.parametrize(
    ("total", "last"),
    [
        (600.0, (60.0, 120.0, 300.0, 600.0, 1200.0)),
        (900.0, (300.0, 600.0, 900.0, 1200.0)),
        (60.0, (30.0, 60.0, 120.0)),
        (45.0, (30.0, 45.0, 60.0)),
        (10_000.0, (3600.0, 7200.0, 10_000.0, 14_400.0)),
    ],
)
def test_buckets_reach_past_the_total_timeout(total: float, last: tuple[float, ...]) -> None:
    bounds = reaching(total)
    assert bounds[-len(last) :] == last
    assert bounds[: len(LATENCY_BUCKETS) - 2] == LATENCY_BUCKETS[:-2]  # the short ones kept
    assert list(bounds) == sorted(set(bounds))


def test_a_request_cut_at_its_deadline_lands_in_a_finite_bucket() -> None:
    h = Histogram(reaching(600.0))
    h.observe(600.002)  # the deadline, and the moment it took to end the answer
    h.observe(590.0)
    cumulative = dict(h.cumulative())
    assert (cumulative["600.0"], cumulative["1200.0"], cumulative["+Inf"]) == (1, 2, 2)


def test_a_family_labelled_by_unit_and_model() -> None:
    family = HistogramFamily("x_seconds", "X.", ("unit", "model"), reaching(600.0))
    family.labels("u0", "m").observe(0.2)
    assert family.labels("u0", "m") is family.labels("u0", "m")  # one child per pair
    (metric,) = family.collect()
    buckets = [s for s in metric.samples if s.name == "x_seconds_bucket"]
    assert buckets[-1].labels == {"unit": "u0", "model": "m", "le": "+Inf"}
    assert buckets[-2].labels["le"] == "1200.0"
    with pytest.raises(ValueError, match="labels"):
        family.labels("u0")

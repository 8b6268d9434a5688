"""A revision's samples: histogram buckets and quantiles, windows that add up across workers,
and their wire form (a seeded RNG; no clock)."""

from __future__ import annotations

import json
import math
from random import Random
from typing import Any

import pytest

from gateway.rollout.samples import (
    BUCKETS,
    HIGHEST,
    LOWEST,
    RATIO,
    TTFT_TOKEN_FLOOR,
    Histogram,
    Window,
    bucket,
    middle,
)

Request = dict[str, Any]  # Window.add's keyword arguments


def random_requests(rng: Random, n: int) -> list[Request]:
    requests = []
    for _ in range(n):
        error = rng.random() < 0.05
        broke = not error and rng.random() < 0.05
        requests.append(
            {
                "error": error,
                "broke": broke,
                "resumed": broke and rng.random() < 0.5,
                "finish": None if error or broke else rng.choice(("stop", "length", "tool_calls")),
                "ttft": None if error else rng.lognormvariate(-2, 1),
                "uncached_tokens": rng.randint(0, 4000),
                "tpot": None if error else rng.lognormvariate(-3.5, 0.5),
            }
        )
    return requests


def window_of(requests: list[Request]) -> Window:
    window = Window()
    for request in requests:
        window.add(**request)
    return window


def random_window(rng: Random, n: int) -> Window:
    return window_of(random_requests(rng, n))


def test_there_are_about_425_buckets_of_5_percent() -> None:
    assert BUCKETS == 425
    assert LOWEST * RATIO**BUCKETS >= HIGHEST > LOWEST * RATIO ** (BUCKETS - 1)


def test_quantiles_are_within_a_bucket_of_the_exact_ones() -> None:
    rng = Random(1)
    samples = [rng.lognormvariate(-3, 1.5) for _ in range(5000)]
    histogram = Histogram()
    for x in samples:
        histogram.add(x)
    samples.sort()
    for q in (0.01, 0.1, 0.5, 0.9, 0.99, 1.0):
        exact = samples[math.ceil(q * len(samples)) - 1]
        estimate = histogram.quantile(q)
        assert estimate is not None
        assert 1 / RATIO <= estimate / exact <= RATIO, q


def test_an_empty_histogram_has_no_quantile() -> None:
    assert Histogram().quantile(0.5) is None


def test_values_outside_the_range_count_in_the_end_buckets() -> None:
    histogram = Histogram()
    for x in (0.0, -1.0, 1e-9, LOWEST):
        histogram.add(x)
    for x in (HIGHEST, 1e6, math.inf):
        histogram.add(x)
    histogram.add(math.nan)  # no sample at all
    assert histogram.items() == [(0, 4), (BUCKETS - 1, 3)]
    assert histogram.count == 7
    assert histogram.quantile(0.5) == middle(0)
    assert histogram.quantile(1.0) == middle(BUCKETS - 1)


def test_a_bucket_holds_values_within_its_ratio() -> None:
    for x in (2e-6, 1e-4, 0.0123, 0.5, 1.0, 7.3, 999.0):
        assert middle(bucket(x)) / math.sqrt(RATIO) <= x * (1 + 1e-9)
        assert x <= middle(bucket(x)) * math.sqrt(RATIO) * (1 + 1e-9)


def test_merged_windows_equal_one_window_of_all_the_requests() -> None:
    rng = Random(2)
    requests = random_requests(rng, 1000)
    cuts = sorted(rng.sample(range(1, 1000), 4))
    merged = Window()
    for start, end in zip([0, *cuts], [*cuts, 1000], strict=True):
        merged.merge(window_of(requests[start:end]))
    assert merged == window_of(requests)
    assert merged.requests == 1000


def test_merging_histograms_adds_bucket_by_bucket() -> None:
    rng = Random(3)
    samples = [rng.lognormvariate(-1, 2) for _ in range(2000)]
    whole, first, second = Histogram(), Histogram(), Histogram()
    for i, x in enumerate(samples):
        whole.add(x)
        (first if i % 3 else second).add(x)
    first.merge(second)
    assert first == whole
    assert first.count == 2000


def test_a_request_is_counted_by_what_happened_to_it() -> None:
    window = Window()
    window.add(error=True)
    window.add(broke=True, resumed=True, ttft=0.2, uncached_tokens=1000, tpot=0.03)
    window.add(broke=True, ttft=0.2, uncached_tokens=1000)
    window.add(resumed=True, finish="stop", ttft=0.016, uncached_tokens=0)  # not broken
    window.add(finish="length", tpot=0.02)
    window.add(finish="content_filter")
    assert (window.requests, window.errors, window.breaks, window.resumed) == (6, 1, 2, 1)
    assert (window.stops, window.lengths, window.others) == (1, 1, 1)
    assert (window.begun, window.finished) == (5, 3)
    assert window.ttft.count == 3 and window.tpot.count == 2
    floored = 0.016 / TTFT_TOKEN_FLOOR  # a prompt its cache held whole
    assert window.ttft.quantile(0.0) == middle(bucket(0.2 / 1000))
    assert window.ttft.quantile(1.0) == middle(bucket(floored))


def test_an_empty_window() -> None:
    window = Window()
    assert window.empty and window.requests == 0
    window.add(error=True)
    assert not window.empty


def test_the_wire_form_is_json_and_round_trips() -> None:
    window = random_window(Random(4), 500)
    wire = window.to_wire()
    assert all(isinstance(v, int | list) for v in wire.values())
    decoded = Window.from_wire(json.loads(json.dumps(wire)))
    assert decoded == window
    assert Window.from_wire(Window().to_wire()) == Window()
    assert len(json.dumps(wire)) < 3000  # sparse: only the buckets that hold samples


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"v": 2}, "v"),
        ({"errors": -1}, "errors"),
        ({"requests": 1.5}, "requests"),
        ({"ttft_counts": [1]}, "ttft"),
        ({"ttft_buckets": [BUCKETS], "ttft_counts": [1]}, "ttft"),
        ({"tpot_buckets": None}, "tpot"),
    ],
)
def test_a_bad_wire_form_names_its_key(change: dict[str, object], key: str) -> None:
    wire: dict[str, object] = {**random_window(Random(5), 50).to_wire(), **change}
    with pytest.raises(ValueError, match=f"^{key}"):
        Window.from_wire(wire)

"""Garbage collection pauses (gateway/observability/gcpause.py): real collections timed on an
explicit clock, by generation, only while installed; and a running gateway's own."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.observability.gcpause import GcPauses
from gateway.server import running
from tests.support import gateway_config


class Clock:
    """Each reading 2 ms after the one before: every collection lasts 2 ms."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.002
        return self.now


@pytest.fixture
def pauses() -> Iterator[GcPauses]:
    """Automatic collections off meanwhile: only the tests' own `gc.collect` calls run."""
    p = GcPauses(Clock())
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield p
    finally:
        p.uninstall()
        if was_enabled:
            gc.enable()


def counts(p: GcPauses) -> dict[str, int]:
    return {g: h.count for (g,), h in p.family.children.items()}


def test_each_collection_is_timed_in_its_generation(pauses: GcPauses) -> None:
    pauses.install()
    for generation in (0, 1, 2, 2):
        gc.collect(generation)
    assert counts(pauses) == {"0": 1, "1": 1, "2": 2}
    full = pauses.family.labels("2")
    assert full.sum == pytest.approx(0.004)
    assert dict(full.cumulative())["0.001"] == 0 and dict(full.cumulative())["0.0025"] == 2


def test_nothing_is_timed_before_install_or_after_uninstall(pauses: GcPauses) -> None:
    gc.collect()
    assert counts(pauses) == {"0": 0, "1": 0, "2": 0}
    pauses.install()
    pauses.install()  # once, however often
    assert gc.callbacks.count(pauses._callback) == 1
    gc.collect()
    pauses.uninstall()
    assert pauses._callback not in gc.callbacks
    gc.collect()
    assert counts(pauses) == {"0": 0, "1": 0, "2": 1}


def test_a_stop_without_its_start_is_not_timed(pauses: GcPauses) -> None:
    pauses._callback("stop", {"generation": 2})  # installed mid-collection
    pauses._callback("start", {"generation": 9})
    pauses._callback("stop", {"generation": 9})  # no such generation
    assert counts(pauses) == {"0": 0, "1": 0, "2": 0}


def test_the_family_is_exported_for_every_generation(pauses: GcPauses) -> None:
    registry = CollectorRegistry()
    registry.register(pauses.family)
    pauses.install()
    gc.collect()
    text = generate_latest(registry).decode()
    assert "# TYPE unitgate_gc_pause_seconds histogram" in text
    assert 'unitgate_gc_pause_seconds_count{generation="2"} 1.0' in text
    assert 'unitgate_gc_pause_seconds_count{generation="0"} 0.0' in text
    assert 'unitgate_gc_pause_seconds_bucket{generation="2",le="0.0025"} 1.0' in text


async def test_a_running_gateway_times_its_collections_and_stops_on_stop() -> None:
    units = [{"id": "u0", "leader": "http://127.0.0.1:1", "nodes": ["http://127.0.0.1:1"]}]
    async with running(gateway_config(units)) as gw:
        assert gw.metrics.gc._callback in gc.callbacks
        gc.collect()
        async with aiohttp.ClientSession() as http, http.get(gw.metrics_url + "/metrics") as r:
            text = await r.text()
        full = [x for x in text.splitlines() if 'seconds_count{generation="2"}' in x]
        assert full and float(full[0].split()[-1]) >= 1.0
    assert gw.metrics.gc._callback not in gc.callbacks

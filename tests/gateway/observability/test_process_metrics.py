"""The process metrics: prometheus_client's ProcessCollector's families, by the same names and
values, with open descriptors counted without listing them; and the build info."""

from __future__ import annotations

import os
import platform
import socket

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector

from gateway.observability import process
from gateway.version import version

pytestmark = pytest.mark.skipif(not os.path.isdir(process.PROC), reason="Linux only")


def values(registry: CollectorRegistry) -> dict[str, tuple[str, float]]:
    return {s.name: (family.type, s.value) for family in registry.collect() for s in family.samples}


def test_the_same_families_as_prometheus_clients_collector() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    ProcessCollector(registry=theirs)
    ours.register(process.ProcessMetrics())
    a, b = values(theirs), values(ours)
    assert set(a) == set(b)
    assert {name: kind for name, (kind, _) in a.items()} == {n: k for n, (k, _) in b.items()}
    for name in ("process_start_time_seconds", "process_max_fds"):
        assert b[name][1] == pytest.approx(a[name][1], abs=0.02), name
    assert abs(b["process_open_fds"][1] - a["process_open_fds"][1]) <= 1  # theirs counts its
    assert b["process_resident_memory_bytes"][1] > 0  # own listing's descriptor


def test_open_descriptors_are_counted() -> None:
    before = process.open_fds()
    pairs = [socket.socketpair() for _ in range(50)]
    try:
        assert process.open_fds() == before + 100
    finally:
        for a, b in pairs:
            a.close()
            b.close()
    assert process.open_fds() == before


def test_build_info() -> None:
    registry = CollectorRegistry()
    process.register(registry)
    labels = {"version": version(), "python": platform.python_version()}
    assert registry.get_sample_value("unitgate_build_info", labels) == 1.0

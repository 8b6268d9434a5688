"""The lock-free counter family exports what prometheus_client's Counter would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from gateway.observability.counter import CounterFamily


def _exposition(registry: CollectorRegistry) -> tuple[list[str], list[str]]:
    """The text format's lines, and the `_created` samples' names and labels (their values
    are wall-clock stamps)."""
    lines = generate_latest(registry).decode().splitlines()
    created = [line.rsplit(" ", 1)[0] for line in lines if "_created{" in line]
    return [line for line in lines if "_created" not in line], created


def test_the_exposition_is_prometheus_clients() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    doc = 'Requests answered, by "unit" and status.'
    reference = Counter("unitgate_requests", doc, ["unit", "status"], registry=theirs)
    family = CounterFamily("unitgate_requests", doc, ["unit", "status"], registry=ours)
    for unit, status, amount in [("u0", "200", 1), ("u1", "429", 2.5), ("u0", "200", 3)]:
        reference.labels(unit, status).inc(amount)
        family.labels(unit, status).inc(amount)
    reference.labels("u2", "200")  # a child at 0
    family.labels("u2", "200")
    assert _exposition(ours) == _exposition(theirs)
    assert ours.get_sample_value("unitgate_requests_total", {"unit": "u0", "status": "200"}) == 4


def test_a_child_is_kept_and_only_goes_up() -> None:
    family = CounterFamily("c", "a counter", ["a"])
    child = family.labels("x")
    child.inc()
    assert family.labels("x") is child and child.value == 1.0
    with pytest.raises(ValueError, match="only go up"):
        child.inc(-1)


def test_the_label_count_is_checked() -> None:
    family = CounterFamily("c", "a counter", ["a", "b"])
    with pytest.raises(ValueError, match=r"c: labels \('a', 'b'\)"):
        family.labels("x")

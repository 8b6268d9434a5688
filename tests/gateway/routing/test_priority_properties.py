"""Properties of the class queues under any sequence of arrivals, completions, departures and
time: no request is lost or settled twice, bounds hold, and every one is settled in the end."""

from __future__ import annotations

from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gateway.config.priority import PriorityClass, PriorityConfig
from tests.gateway.routing.priority_support import FakeGateway

TIGHT = PriorityConfig(
    classes=(
        PriorityClass("interactive", 0, 0.3, queue_size=2, queue_timeout=1.0, unit_priority=-1),
        PriorityClass("standard", 1, 0.2, queue_size=3, queue_timeout=2.0),
        PriorityClass("batch", 2, 0.0, queue_size=5, queue_timeout=30.0, unit_priority=1),
    )
)
CLASSES = ("interactive", "standard", "batch")

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"),
            st.sampled_from(CLASSES),
            st.sampled_from(("a", "b", "c")),
            st.integers(1, 500),
            st.integers(1, 6),  # a burst
        ),
        st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("leave"), st.integers(0, 50)),
    ),
    min_size=10,
    max_size=80,
)


def _step(gw: FakeGateway, now: float, op: tuple[Any, ...]) -> float:
    kind = op[0]
    if kind == "arrive":
        for _ in range(op[4]):
            gw.arrive(now, op[1], op[2], op[3])
    elif kind == "tick":
        now += op[1]
        gw.pump(now)
    elif kind == "finish" and gw.running:
        gw.finish(list(gw.running.values())[op[1] % len(gw.running)], now)
    elif kind == "leave" and len(gw.queues):
        gw.leave(list(gw.queues)[op[1] % len(gw.queues)], now)
    return now


def _check(gw: FakeGateway, now: float) -> None:
    waiting = [e.handle for e in gw.queues]
    assert len(waiting) == len(set(waiting))  # nobody queued twice
    assert set(waiting) == {h for h, f in gw.fate.items() if f == "waiting"}  # nobody lost
    assert len(gw.running) <= gw.capacity and len(waiting) <= gw.queue_limit
    for c in gw.config.classes:
        assert gw.queues.waiting(c.name) <= c.queue_size
    assert all(now < gw.queues.deadline(e) for e in gw.queues)  # pumped: nobody overdue


@settings(max_examples=300, deadline=None)
@given(ops=ops, capacity=st.integers(1, 8), queue_limit=st.integers(0, 12), config=st.booleans())
def test_every_request_is_settled_exactly_once(
    ops: list[tuple[Any, ...]], capacity: int, queue_limit: int, config: bool
) -> None:
    gw = FakeGateway(TIGHT if config else PriorityConfig(), capacity, queue_limit)
    now = 0.0
    for op in ops:
        now = _step(gw, now, op)
        _check(gw, now)
    # Drain without time passing: an idle gateway has a slot for every class.
    while gw.running:
        gw.finish(next(iter(gw.running.values())), now)
        _check(gw, now)
    assert len(gw.queues) == 0
    assert set(gw.fate.values()) <= {"done", "shed", "displaced", "expired", "left"}
    for fate in set(gw.fate.values()):
        event(fate)

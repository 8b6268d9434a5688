"""Tenant fairness within a class, simulated on a fake clock: a flood cannot starve anyone."""

from __future__ import annotations

from collections import Counter

from gateway.config.priority import PriorityClass, PriorityConfig
from gateway.routing.fairshare import FairLine
from tests.gateway.routing.priority_support import FakeGateway

ONE_CLASS = PriorityConfig(
    classes=(PriorityClass("standard", 0, queue_size=256, queue_timeout=1e6),),
    default="standard",
)
STEP, SERVICE = 0.1, 1.0  # seconds per tick; every request runs one second


def _run(gw: FakeGateway, ticks: int, arrivals: dict[str, tuple[int, int, int]]) -> None:
    """`arrivals`: tenant -> (every how many ticks, how many, tokens each)."""
    _run_from(gw, 0, ticks, arrivals)


def test_a_steady_tenant_waits_behind_at_most_one_request_of_a_flooding_one() -> None:
    gw = FakeGateway(ONE_CLASS, capacity=4, queue_limit=1024)
    # a: 20 requests a second into 4 slots a second (a flood); b: one every 2 s.
    _run(gw, 2000, {"a": (1, 2, 100), "b": (20, 1, 100)})
    assert len(gw.queues) == 256  # a's flood kept the line full
    admitted_b = [(i, e) for i, e in enumerate(gw.admitted) if e.tenant == "b"]
    assert len(admitted_b) == 100  # every one of b's, none shed
    for position, e in admitted_b:
        ahead = gw.admitted[gw.admitted_before[e.handle] : position]
        assert sum(x.tenant == "a" for x in ahead) <= 1, (e, ahead)
    assert len(gw.admitted) == 4 * 200  # and a had every slot b did not use
    shed = gw.fated("shed")  # past its queue, the flood's own arrivals are shed
    assert shed and {e.tenant for e in shed} == {"a"}


def test_with_headroom_a_steady_tenant_starts_at_once_beside_a_flood() -> None:
    """Rule 7: the flood holds 3 of the 4 slots while b is active, so b never waits; once b
    has been quiet for ACTIVE_WINDOW, the flood uses all 4 again."""
    gw = FakeGateway(ONE_CLASS, capacity=4, queue_limit=1024, headroom=True)
    _run(gw, 1000, {"a": (1, 2, 100), "b": (20, 1, 100)})  # 100 s, b every 2 s
    b = [e for e in gw.admitted if e.tenant == "b"]
    assert len(b) == 50 and all(gw.admitted_at[e.handle] == e.since for e in b)
    busy = Counter(e.tenant for e in gw.running.values())
    assert busy["a"] == 3  # one slot kept for b
    quiet = len(gw.admitted)
    _run_from(gw, 1000, 1300, {"a": (1, 2, 100)})  # b gone for 30 s
    assert Counter(e.tenant for e in gw.running.values())["a"] == 4
    # b last came at 98 s, so it counts until 108 s: 3 a second for 8 s, then 4 for 22 s.
    assert abs(len(gw.admitted) - quiet - (3 * 8 + 4 * 22)) <= 4


def test_alone_a_tenant_uses_every_slot_with_headroom_on() -> None:
    gw = FakeGateway(ONE_CLASS, capacity=4, queue_limit=1024, headroom=True)
    _run(gw, 200, {"a": (1, 2, 100)})
    assert len(gw.admitted) == 4 * 20


def _run_from(
    gw: FakeGateway, first: int, last: int, arrivals: dict[str, tuple[int, int, int]]
) -> None:
    for tick in range(first, last):
        now = tick * STEP
        for e in [e for e in gw.running.values() if gw.admitted_at[e.handle] + SERVICE <= now]:
            gw.finish(e, now)
        for tenant, (every, count, tokens) in arrivals.items():
            if tick % every == 0:
                for _ in range(count):
                    gw.arrive(now, "standard", tenant, tokens)


def test_two_floods_get_the_same_tokens_whatever_their_request_sizes() -> None:
    gw = FakeGateway(ONE_CLASS, capacity=4, queue_limit=1024)
    _run(gw, 1000, {"small": (1, 2, 100), "large": (1, 2, 400)})
    served = Counter[str]()
    for e in gw.admitted:
        served[e.tenant] += e.tokens
        assert abs(served["small"] - served["large"]) <= 2 * 400
    assert (
        Counter(e.tenant for e in gw.admitted)["small"]
        > 3 * Counter(e.tenant for e in gw.admitted)["large"]
    )


def test_a_tenant_back_from_idle_banks_no_credit() -> None:
    line: FairLine[_W] = FairLine()
    for i in range(5):
        line.push(_W("busy", 100, float(i)))
    for _ in range(3):
        line.pop(lambda w: True)  # busy: 300 tokens served, 2 waiting
    line.push(_W("quiet", 100, 10.0))  # joins at the smallest waiting counter: 300, not 0
    assert line.counter("quiet") == line.counter("busy") == 300
    popped = [line.pop(lambda w: True) for _ in range(3)]
    assert [w.tenant for w in popped if w] == ["busy", "quiet", "busy"]


def test_counters_of_tenants_gone_quiet_are_bounded() -> None:
    line: FairLine[_W] = FairLine(remembered=8)
    for i in range(1000):
        line.serve(f"t{i}", 100 + i)
    assert len(line._counters) <= 2 * 8
    assert line.counter("t999") == 1099  # the most served are the ones remembered
    assert line.counter("t0") == 0.0  # forgotten: back at the lift


class _W:
    __slots__ = ("since", "tenant", "tokens")

    def __init__(self, tenant: str, tokens: int, since: float) -> None:
        self.tenant, self.tokens, self.since = tenant, tokens, since

"""Properties of the limits under any interleaving of several replicas sharing one store (the
in-memory one, on a fake clock): never more than the limit in any 60 s span, and with demand
to spare, the limit is reached to within one."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.limits.decisions import Grant, KeyLimits
from gateway.limits.memory import Counts, MemoryStore
from gateway.limits.store import Answer, Ask, Changes
from tests.gateway.limits.limits_support import T0, FlakyStore, Fleet

steps = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=2.0, allow_nan=False),  # time to the next request
        st.integers(min_value=0, max_value=3),  # its replica (modulo the fleet's size)
        st.integers(min_value=1, max_value=400),  # its token estimate
        st.floats(min_value=0, max_value=1, allow_nan=False),  # used, as a share of it
    ),
    min_size=1,
    max_size=300,
)


def fleet_of(replicas: int) -> Fleet:
    counts = Counts()
    return Fleet.of([MemoryStore(f"r{i}", counts=counts) for i in range(replicas)])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=400, max_value=5000),
    steps,
)
async def test_no_60_s_span_ever_holds_more_than_the_limits(
    replicas: int, rpm: int, tpm: int, plan: list[tuple[float, int, int, float]]
) -> None:
    fleet = fleet_of(replicas)
    limits = KeyLimits(rpm=rpm, tpm=tpm)
    used: dict[int, int] = {}  # grant index -> tokens it was settled with
    for gap, replica, estimate, share in plan:
        await fleet.advance(fleet.now + gap)
        grant = await fleet.admit(replica % replicas, "k", limits, estimate)
        if grant is not None:
            used[len(fleet.grants) - 1] = round(estimate * share)
            fleet.settle(replica % replicas, grant, used[len(fleet.grants) - 1])
    times = [t for t, _, _ in fleet.grants]
    for start in times:
        inside = [i for i, t in enumerate(times) if start <= t <= start + 60]
        assert len(inside) <= rpm
        assert sum(used[i] for i in inside) <= tpm


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=1, max_value=200),
    st.lists(st.floats(min_value=0, max_value=59.9, allow_nan=False), min_size=20, max_size=40),
    st.randoms(use_true_random=False),
)
async def test_with_demand_to_spare_the_limit_is_reached_to_within_one(
    replicas: int, rpm: int, extra: list[float], rng: random.Random
) -> None:
    fleet = fleet_of(replicas)
    limits = KeyLimits(rpm=rpm)
    # 2.5 x the limit, spread over the minute, plus a few at random times
    times = sorted([i * 60 / (2.5 * rpm) for i in range(int(2.5 * rpm))] + extra)
    for t in times:
        await fleet.advance(T0 + t)
        await fleet.admit(rng.randrange(replicas), "k", limits, 0)
    assert rpm - 1 <= len(fleet.grants) <= rpm


class YieldingStore(MemoryStore):
    """Suspends before each call, so concurrent admissions interleave around the store."""

    def __init__(self, replica: str, counts: Counts, rng: random.Random) -> None:
        super().__init__(replica, counts=counts)
        self.rng = rng

    async def take(self, key: str, asks: Sequence[Ask], now: float) -> list[Answer]:
        for _ in range(self.rng.randrange(3)):
            await asyncio.sleep(0)
        return self.take_now(key, asks, now)

    async def push(self, changes: Changes, now: float) -> None:
        for _ in range(self.rng.randrange(3)):
            await asyncio.sleep(0)
        self.push_now(changes, now)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=1, max_value=8),
    st.lists(st.floats(min_value=0, max_value=3, allow_nan=False), min_size=1, max_size=60),
    st.randoms(use_true_random=False),
)
async def test_concurrent_admissions_around_a_slow_store_stay_within_the_limits(
    replicas: int, rpm: int, inflight: int, gaps: list[float], rng: random.Random
) -> None:
    counts = Counts()
    fleet = Fleet.of([YieldingStore(f"r{i}", counts, rng) for i in range(replicas)])
    limits = KeyLimits(rpm=rpm, max_inflight=inflight)
    live: list[tuple[int, Grant]] = []
    for gap in gaps:
        await fleet.advance(fleet.now + gap)
        picks = [rng.randrange(replicas) for _ in range(rng.randrange(1, 6))]
        await asyncio.gather(*(fleet.admit(r, "k", limits, 0) for r in picks))
        live += [(r, g) for _, r, g in fleet.grants if not g.settled and (r, g) not in live]
        assert len(live) <= inflight
        while live and rng.random() < 0.5:
            replica, grant = live.pop(rng.randrange(len(live)))
            fleet.settle(replica, grant, 0)
    times = [t for t, _, _ in fleet.grants]
    for start in times:
        assert sum(1 for t in times if start <= t <= start + 60) <= rpm


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=40),
    st.lists(
        st.tuples(st.floats(min_value=0, max_value=3, allow_nan=False), st.integers(0, 2)),
        min_size=1,
        max_size=150,
    ),
    st.randoms(use_true_random=False),
)
async def test_with_the_store_coming_and_going_a_replica_on_its_own_keeps_its_share(
    replicas: int, rpm: int, plan: list[tuple[float, int]], rng: random.Random
) -> None:
    counts = Counts()
    flaky = [FlakyStore(MemoryStore(f"r{i}", counts=counts)) for i in range(replicas)]
    fleet = Fleet.of(flaky)
    limits = KeyLimits(rpm=rpm, max_inflight=rpm)
    share = max(1, rpm // replicas)
    alone: list[tuple[float, int]] = []  # admissions made while the replica was on its own
    for gap, replica in plan:
        await fleet.advance(fleet.now + gap)
        if rng.random() < 0.1:  # the store goes away, or comes back, for one or for all
            down = not flaky[0].down
            for store in flaky if rng.random() < 0.5 else [flaky[replica % replicas]]:
                store.down = down
        r = replica % replicas
        grant = await fleet.admit(r, "k", limits, 0)  # never raises
        if grant is not None:
            if fleet.limiters[r].degraded:
                alone.append((fleet.now, r))
            fleet.settle(r, grant, 0)
    for t, r in alone:
        own = sum(1 for s, q, _ in fleet.grants if q == r and t - 60 <= s <= t)
        assert own <= share


async def test_a_burst_on_a_fresh_key_sends_one_take_not_one_per_request() -> None:
    class SlowStore(MemoryStore):  # every take is a round trip: it suspends
        async def take(self, key: str, asks: Sequence[Ask], now: float) -> list[Answer]:
            await asyncio.sleep(0.001)
            return self.take_now(key, asks, now)

    fleet = Fleet.of([SlowStore()])
    limits = KeyLimits(rpm=1000, tpm=1_000_000, max_inflight=500)
    answers = await asyncio.gather(*(fleet.admit(0, "k", limits, 100) for _ in range(200)))
    assert all(answers)
    assert fleet.limiters[0].takes <= 3, fleet.limiters[0].takes

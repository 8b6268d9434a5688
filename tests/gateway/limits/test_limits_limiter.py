"""The Limiter on the in-memory store and a fake clock: the limits, the headers, the round
trips leases save, and the local shares while the store is away."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from pathlib import Path

from gateway.config.limits import LimitsConfig
from gateway.limits.decisions import Grant, KeyLimits, Refusal
from gateway.limits.limiter import Limiter
from gateway.limits.memory import Counts, MemoryStore
from gateway.limits.store import Changes
from tests.gateway.limits.limits_support import T0, FlakyStore, Fleet

RPM = KeyLimits(rpm=120)


def fleet_of(replicas: int, counts: Counts | None = None, **config: float) -> Fleet:
    counts = counts if counts is not None else Counts()
    stores = [MemoryStore(f"r{i}", counts=counts) for i in range(replicas)]
    return Fleet.of(stores, LimitsConfig(**config))  # type: ignore[arg-type]


async def test_a_key_at_120_rpm_gets_120_of_300_requests_over_three_replicas() -> None:
    counts = Counts()
    fleet = fleet_of(3, counts)
    for i in range(300):
        await fleet.advance(T0 + i * 0.2)
        await fleet.admit(i % 3, "k", RPM, 0)
    assert len(fleet.grants) == 120
    # the store was asked far less than once per request
    assert counts.ops / 300 < 0.9
    refusal = fleet.refusals[-1][1]
    assert refusal.dim == "requests" and refusal.code == "rate_limit_exceeded"
    assert refusal.retry_after >= 1
    assert refusal.headers()["x-ratelimit-remaining-requests"] == "0"


async def test_the_window_frees_after_61_s_and_retry_after_says_when() -> None:
    fleet = fleet_of(1)
    limits = KeyLimits(rpm=3)
    for _ in range(3):
        assert await fleet.admit(0, "k", limits, 0) is not None
    await fleet.advance(T0 + 10.5)
    assert await fleet.admit(0, "k", limits, 0) is None
    refusal = fleet.refusals[-1][1]
    assert refusal.retry_after == 51  # the bucket of T0 leaves at T0 + 61
    assert refusal.headers()["x-ratelimit-reset-requests"] == "51s"
    await fleet.advance(T0 + 60.99)
    assert await fleet.admit(0, "k", limits, 0) is None
    await fleet.advance(T0 + 61.0)
    assert await fleet.admit(0, "k", limits, 0) is not None


async def test_a_lease_left_in_the_last_bucket_does_not_refuse_the_next_ones_requests() -> None:
    """A request takes a lease just before a second ends; the next two, just after it, must
    not be refused because of the unspent rest of that lease, which the store would count
    until the next flush pushed it back: it goes back before the take."""
    fleet = fleet_of(1, flush_interval=10.0, slots_ttl=40.0)  # no flush in between
    limits = KeyLimits(rpm=3)
    await fleet.advance(T0 + 0.9)
    assert await fleet.admit(0, "k", limits, 0) is not None
    await fleet.advance(T0 + 1.05)
    assert await fleet.admit(0, "k", limits, 0) is not None
    assert await fleet.admit(0, "k", limits, 0) is not None
    assert await fleet.admit(0, "k", limits, 0) is None  # and the limit still holds
    assert fleet.refusals[-1][1].dim == "requests"


async def test_a_grant_carries_the_six_headers_and_remaining_goes_down() -> None:
    fleet = fleet_of(1)
    limits = KeyLimits(rpm=10, tpm=1000)
    first = await fleet.admit(0, "k", limits, 100)
    second = await fleet.admit(0, "k", limits, 100)
    assert first is not None and second is not None
    headers = second.headers()
    assert headers["x-ratelimit-limit-requests"] == "10"
    assert headers["x-ratelimit-remaining-requests"] == "8"
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "800"
    assert headers["x-ratelimit-reset-tokens"] == "1m1s"


async def test_tokens_are_reserved_then_settled_with_what_was_generated() -> None:
    fleet = fleet_of(1)
    limits = KeyLimits(tpm=1000)
    grants = [await fleet.admit(0, "k", limits, 400) for _ in range(2)]
    assert await fleet.admit(0, "k", limits, 400) is None  # 800 reserved, 400 more do not fit
    await fleet.advance(T0 + 2)
    for grant in grants:
        assert grant is not None
        fleet.settle(0, grant, 100)  # the answers were short: 600 back
        fleet.settle(0, grant, 100)  # settling twice changes nothing
    await fleet.advance(T0 + 3)
    assert await fleet.admit(0, "k", limits, 700) is not None  # 200 used, 700 fits
    too_large = await fleet.limiters[0].admit("k", limits, 5000, fleet.now)
    assert isinstance(too_large, Refusal) and too_large.too_large


async def test_a_client_that_left_is_charged_for_what_was_generated() -> None:
    fleet = fleet_of(1)
    limits = KeyLimits(tpm=1000)
    grant = await fleet.admit(0, "k", limits, 100)
    assert grant is not None
    await fleet.advance(T0 + 5)
    fleet.settle(0, grant, 900)  # it asked for 100, went away, 900 were generated
    await fleet.advance(T0 + 6)
    assert await fleet.admit(0, "k", limits, 200) is None


async def test_in_flight_holds_across_replicas_and_a_dead_replicas_slots_expire() -> None:
    fleet = fleet_of(2, slots_ttl=3.0)
    limits = KeyLimits(max_inflight=4)
    held = [await fleet.admit(i % 2, "k", limits, 0) for i in range(4)]
    assert all(held)
    assert await fleet.admit(0, "k", limits, 0) is None
    assert await fleet.admit(1, "k", limits, 0) is None
    grant = held[1]
    assert grant is not None
    fleet.settle(1, grant, 0)
    assert await fleet.admit(1, "k", limits, 0) is not None  # its own slot, no round trip
    # replica 0 dies holding 2: its slots are let go once its report expires
    del fleet.limiters[0]
    await fleet.advance(T0 + 2.0)
    assert await fleet.admit(0, "k", limits, 0) is None
    await fleet.advance(T0 + 3.5)
    assert await fleet.admit(0, "k", limits, 0) is not None


async def test_a_busy_key_costs_the_store_a_few_calls_per_second_not_one_per_request() -> None:
    counts = Counts()
    fleet = fleet_of(3, counts)
    limits = KeyLimits(rpm=100_000, tpm=10_000_000, max_inflight=1000)
    rng = random.Random(7)
    live: list[tuple[int, Grant]] = []
    requests = 6000
    for i in range(requests):  # 100 requests/s for a minute
        await fleet.advance(T0 + i * 0.01)
        replica = rng.randrange(3)
        grant = await fleet.admit(replica, "k", limits, 300)
        assert grant is not None
        live.append((replica, grant))
        if len(live) > 20:
            done_replica, done = live.pop(0)
            fleet.settle(done_replica, done, rng.randint(100, 500))
    per_request = counts.ops / requests
    assert per_request < 0.2, per_request


async def test_a_client_over_its_limit_costs_one_store_call_per_bucket() -> None:
    counts = Counts()
    fleet = fleet_of(1, counts)
    limits = KeyLimits(rpm=5)
    for i in range(1000):
        await fleet.advance(T0 + i * 0.005)  # 200 requests/s for 5 s
        await fleet.admit(0, "k", limits, 0)
    assert len(fleet.grants) == 5
    assert counts.ops <= 5 * 2 + 50  # a take per bucket, a flush per interval at most


async def test_with_the_store_away_each_replica_enforces_its_share_then_replays_it() -> None:
    counts = Counts()
    flaky = [FlakyStore(MemoryStore(f"r{i}", counts=counts)) for i in range(3)]
    fleet = Fleet.of(flaky)
    for i in range(30):  # 10 each before the outage
        await fleet.advance(T0 + i * 0.1)
        assert await fleet.admit(i % 3, "k", RPM, 0) is not None
    for store in flaky:
        store.down = True
    for i in range(300):
        await fleet.advance(T0 + 3 + i * 0.1)
        await fleet.admit(i % 3, "k", RPM, 0)
    assert all(limiter.degraded for limiter in fleet.limiters)
    assert len(fleet.grants) == 120  # each 40 = 120 // 3, counting its own 10 from before
    for store in flaky:
        store.down = False
    await fleet.advance(fleet.now + 0.2)
    assert not any(limiter.degraded for limiter in fleet.limiters)
    # replayed: the shared window knows the minute is spent, and frees on time
    assert sum(counts.windows[("k", "requests")].values()) == 120
    assert await fleet.admit(0, "k", RPM, 0) is None
    await fleet.advance(T0 + 62)
    assert await fleet.admit(0, "k", RPM, 0) is not None


async def test_a_store_away_at_the_first_request_refuses_beyond_the_share() -> None:
    store = FlakyStore(MemoryStore())
    store.down = True
    limiter = Limiter(store, live_replicas=lambda: 4, clock=lambda: T0)
    answers = [
        await limiter.admit("k", KeyLimits(rpm=10, max_inflight=100), 0, T0) for _ in range(5)
    ]
    assert [isinstance(a, Grant) for a in answers] == [True, True, False, False, False]
    assert limiter.degraded


async def test_close_hands_back_the_leases() -> None:
    counts = Counts()
    limiter = Limiter(MemoryStore(counts=counts), clock=lambda: T0)
    assert isinstance(await limiter.admit("k", KeyLimits(rpm=1000, max_inflight=50), 0, T0), Grant)
    assert sum(counts.windows[("k", "requests")].values()) > 1  # a lease
    await limiter.close()
    assert sum(counts.windows[("k", "requests")].values()) == 1
    assert counts.slots["k"]["local"][0] == 1  # the request still in flight keeps its slot


async def test_the_store_is_chosen_by_the_state_backend(tmp_path: Path) -> None:
    from gateway.config.state import StateConfig
    from gateway.limits.build import build_limiter
    from gateway.limits.redis_store import RedisStore

    alone = build_limiter(LimitsConfig(), StateConfig())
    assert isinstance(alone.store, MemoryStore)
    answer = await alone.admit("k", KeyLimits(rpm=10), 0, T0)
    assert isinstance(answer, Grant)
    assert Limiter.headers(answer)["x-ratelimit-remaining-requests"] == "9"  # the whole limit
    # Two workers without a shared store: each enforces half of every limit.
    worker = build_limiter(LimitsConfig(), StateConfig(), workers=2)
    answer = await worker.admit("k", KeyLimits(rpm=10), 0, T0)
    assert isinstance(answer, Grant)
    assert Limiter.headers(answer)["x-ratelimit-limit-requests"] == "5"
    shared = build_limiter(LimitsConfig(), StateConfig(backend="redis", url=f"unix://{tmp_path}/r"))
    assert isinstance(shared.store, RedisStore)
    assert shared.store.replica.endswith(f"/{os.getpid()}")  # a worker's entry is its own
    await shared.close()  # nothing to hand back: no call made


async def test_close_during_a_push_loses_nothing() -> None:
    counts = Counts()

    class SlowStore(MemoryStore):
        async def push(self, changes: Changes, now: float) -> None:
            await asyncio.sleep(10)

    slow = SlowStore(counts=counts)
    clock = [T0]
    limiter = Limiter(
        slow, LimitsConfig(flush_interval=0.01, slots_ttl=1.0), clock=lambda: clock[0]
    )
    grant = await limiter.admit("k", KeyLimits(tpm=1000), 100, T0)
    assert isinstance(grant, Grant)
    limiter.settle(grant, 40)
    limiter.start()
    await asyncio.sleep(0.05)  # the loop is inside its push now
    slow.push = MemoryStore.push.__get__(slow)  # type: ignore[method-assign]
    await limiter.close()
    assert sum(counts.windows[("k", "tokens")].values()) == 40  # the refund and the lease back


async def test_a_replica_back_first_keeps_to_its_share_until_the_others_replay() -> None:
    """Three replicas admit their shares while the store is away; one reaches the store
    again a flush before the others. The shared count then lacks their replays, yet the
    fleet still admits no more than the limit in the minute."""
    counts = Counts()
    stores = [FlakyStore(MemoryStore(f"r{i}", counts=counts)) for i in range(3)]
    limiters = [Limiter(s, live_replicas=lambda: 3, clock=lambda: T0) for s in stores]
    limits = KeyLimits(rpm=90)
    admitted = 0
    for i in range(30):  # 10 through each, on the store
        admitted += isinstance(await limiters[i % 3].admit("k", limits, 0, T0), Grant)
    for limiter in limiters:
        await limiter.flush(T0 + 0.3)
    for store in stores:
        store.down = True
    for i in range(150):  # 20 more through each: its share, 90 // 3, less its own 10
        admitted += isinstance(await limiters[i % 3].admit("k", limits, 0, T0 + 1), Grant)
    assert admitted == 90
    stores[0].down = False
    await limiters[0].flush(T0 + 2)  # r0 is back and has replayed; r1 and r2 have not
    assert not limiters[0].degraded and limiters[1].degraded
    late = [await limiters[0].admit("k", limits, 0, T0 + 2.5) for _ in range(30)]
    assert not any(isinstance(a, Grant) for a in late)  # its share is spent: no more
    assert all(isinstance(a, Refusal) and a.dim == "requests" for a in late)


async def test_close_returns_though_a_store_call_swallows_the_cancellation() -> None:
    """redis-py calls may swallow a cancellation; the flush loop must still end, and `close`
    return (CI once hung a replica process for a minute here)."""

    class Swallowing(MemoryStore):
        shared = True  # a census to keep, as Redis's: the loop runs with no account open

        async def census(self, now: float) -> int:
            with contextlib.suppress(asyncio.CancelledError):  # as a swallowing call does
                await asyncio.sleep(10)
            return 1

    limiter = Limiter(Swallowing(), LimitsConfig(flush_interval=0.01, slots_ttl=1.0))
    limiter.start()
    await asyncio.sleep(0.05)  # inside the census
    await asyncio.wait_for(limiter.close(), 3.0)


class _Counting(MemoryStore):
    """Counts its census and push calls."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.shared = shared
        self.calls: list[str] = []

    async def census(self, now: float) -> int:
        self.calls.append("census")
        return 1

    async def push(self, changes: Changes, now: float) -> None:
        self.calls.append("push")
        await super().push(changes, now)


async def test_with_nothing_to_flush_and_no_census_the_loop_parks_until_an_account_opens() -> None:
    """A gateway whose keys have no limits never wakes for its limiter (a store nobody else
    reads keeps no census); the first account wakes the loop, and its settle goes out."""
    store = _Counting(shared=False)
    limiter = Limiter(store, LimitsConfig(flush_interval=0.01, slots_ttl=1.0))
    limiter.start()
    await asyncio.sleep(0.1)  # ten flush intervals
    assert store.calls == []
    grant = await limiter.admit("k", KeyLimits(tpm=1000), 100, time.time())  # its clock's
    assert isinstance(grant, Grant)
    limiter.settle(grant, 40)
    deadline = asyncio.get_running_loop().time() + 3.0
    while "push" not in store.calls and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert "push" in store.calls  # the settle was flushed without `close`
    await limiter.close()


async def test_a_shared_store_hears_the_census_with_no_account_open() -> None:
    """The fleet's store counts replicas by their census: it goes on with nothing to flush."""
    store = _Counting(shared=True)
    limiter = Limiter(store, LimitsConfig(flush_interval=0.01, slots_ttl=1.0))
    limiter.start()
    deadline = asyncio.get_running_loop().time() + 3.0
    while store.calls.count("census") < 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert store.calls.count("census") >= 2 and "push" not in store.calls
    await limiter.close()

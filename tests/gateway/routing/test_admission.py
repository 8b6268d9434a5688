"""Admission control: caps, FIFO waiting, deadlines and the queue bound."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from gateway.errors import Overloaded
from gateway.routing.admission import Admission


@dataclass(eq=False)
class Slot:
    cap: int
    inflight: int = 0


def picker(*slots: Slot):  # type: ignore[no-untyped-def]
    def pick() -> Slot | None:
        free = [s for s in slots if s.inflight < s.cap]
        return free[0] if free else None

    return pick


async def test_acquire_and_release() -> None:
    adm = Admission(queue_size=4, queue_timeout=1.0, retry_after=2)
    slot = Slot(cap=1)
    got = await adm.acquire(picker(slot))
    assert got is slot and slot.inflight == 1
    adm.release(slot)
    assert slot.inflight == 0


async def test_waiters_are_served_in_order() -> None:
    adm = Admission(queue_size=4, queue_timeout=5.0, retry_after=1)
    slot = Slot(cap=1)
    await adm.acquire(picker(slot))
    order: list[int] = []

    async def wait(i: int) -> None:
        await adm.acquire(picker(slot))
        order.append(i)
        adm.release(slot)

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    while adm.queued < 3:
        await asyncio.sleep(0)
    adm.release(slot)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert slot.inflight == 0 and adm.queued == 0


async def test_deadline_gives_429_with_retry_after() -> None:
    adm = Admission(queue_size=4, queue_timeout=0.05, retry_after=3)
    slot = Slot(cap=0)
    with pytest.raises(Overloaded) as err:
        await adm.acquire(picker(slot))
    assert err.value.status == 429 and err.value.headers() == {"Retry-After": "3"}
    assert adm.queued == 0


async def test_full_queue_refuses_at_once() -> None:
    adm = Admission(queue_size=1, queue_timeout=10.0, retry_after=1)
    slot = Slot(cap=0)
    waiter = asyncio.create_task(adm.acquire(picker(slot)))
    while adm.queued < 1:
        await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="queue is full"):
        await adm.acquire(picker(slot))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.queued == 0


async def test_cancelled_waiter_passes_its_wakeup_on() -> None:
    adm = Admission(queue_size=4, queue_timeout=5.0, retry_after=1)
    slot = Slot(cap=1)
    await adm.acquire(picker(slot))
    first = asyncio.create_task(adm.acquire(picker(slot)))
    second = asyncio.create_task(adm.acquire(picker(slot)))
    while adm.queued < 2:
        await asyncio.sleep(0)
    adm.release(slot)  # wakes `first` ...
    first.cancel()  # ... which leaves before using it
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1.0) is slot


async def test_waiter_that_cannot_use_a_slot_passes_it_on() -> None:
    adm = Admission(queue_size=4, queue_timeout=5.0, retry_after=1)
    a, b = Slot(cap=1), Slot(cap=1)
    await adm.acquire(picker(a))
    await adm.acquire(picker(b))
    wants_a = asyncio.create_task(adm.acquire(picker(a)))
    wants_b = asyncio.create_task(adm.acquire(picker(b)))
    while adm.queued < 2:
        await asyncio.sleep(0)
    adm.release(b)  # the head wants `a`: the wake-up must reach the one that wants `b`
    assert await asyncio.wait_for(wants_b, 1.0) is b
    assert not wants_a.done()
    adm.release(a)
    assert await asyncio.wait_for(wants_a, 1.0) is a


async def test_no_unit_error_from_pick_propagates() -> None:
    adm = Admission(queue_size=4, queue_timeout=1.0, retry_after=1)

    def pick() -> Slot | None:
        raise Overloaded("none", status=503, code="no_routable_unit", retry_after=1)

    with pytest.raises(Overloaded) as err:
        await adm.acquire(pick)
    assert err.value.status == 503


async def test_the_gateways_own_limit_queues_like_full_units() -> None:
    """Every unit has room, but the gateway may hold only 2 requests (its open files):
    the third waits for a release, the fourth times out with 429."""
    adm = Admission(queue_size=4, queue_timeout=0.05, retry_after=1, limit=2)
    a, b = Slot(cap=100), Slot(cap=100)
    pick = picker(a, b)
    first, second = await adm.acquire(pick), await adm.acquire(pick)
    assert adm.inflight == 2
    third = asyncio.create_task(adm.acquire(pick))
    await asyncio.sleep(0)
    assert not third.done() and adm.queued == 1
    adm.release(first)
    assert await third is a and adm.inflight == 2
    with pytest.raises(Overloaded) as refused:
        await adm.acquire(pick)
    assert refused.value.status == 429 and refused.value.code == "saturated"
    adm.release(second)
    adm.release(a)
    assert adm.inflight == 0

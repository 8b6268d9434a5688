"""Admission over priority classes on a real event loop: what the class queues decide (pure,
tests/gateway/routing/test_priority_*.py) carried out with real waiters, slots and deadlines."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config.priority import PriorityClass, PriorityConfig
from gateway.errors import Overloaded
from gateway.routing.admission import Admission, Ask
from tests.gateway.routing.test_admission import Slot, picker


def classes(
    reserved: float = 0.0, queue: int = 8, timeout: float = 5.0, batch_timeout: float = 5.0
) -> PriorityConfig:
    return PriorityConfig(
        classes=(
            PriorityClass("interactive", 0, reserved, queue_size=queue, queue_timeout=timeout),
            PriorityClass("standard", 1, 0.0, queue_size=queue, queue_timeout=timeout),
            PriorityClass("batch", 2, 0.0, queue_size=queue, queue_timeout=batch_timeout),
        )
    )


INTERACTIVE, STANDARD, BATCH = Ask("interactive"), Ask("standard"), Ask("batch")


async def queued(adm: Admission, count: int) -> None:
    for _ in range(100):
        if adm.queued >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{adm.queued} queued, expected {count}")


async def test_a_freed_slot_goes_to_the_more_important_class_though_it_came_later() -> None:
    adm = Admission(16, 5.0, 1, limit=1, classes=classes())
    slot = Slot(cap=1)
    pick = picker(slot)
    await adm.acquire(pick, BATCH)
    order: list[str] = []

    async def wait(ask: Ask) -> None:
        await adm.acquire(pick, ask)
        order.append(ask.klass)
        adm.release(slot, ask.klass)

    tasks = [asyncio.create_task(wait(a)) for a in (BATCH, STANDARD, INTERACTIVE)]
    await queued(adm, 3)
    assert (adm.waiting("batch"), adm.waiting("standard"), adm.waiting("interactive")) == (1, 1, 1)
    adm.release(slot, "batch")
    await asyncio.gather(*tasks)
    assert order == ["interactive", "standard", "batch"]
    assert slot.inflight == 0 and adm.inflight == 0 and adm.used == dict.fromkeys(order, 0)


async def test_a_reserved_share_is_held_back_from_less_important_classes() -> None:
    """5 slots, interactive reserves 20%: standard gets 4, the 5th waits for interactive."""
    adm = Admission(16, 0.05, 1, limit=5, classes=classes(reserved=0.2, timeout=0.05))
    slot = Slot(cap=100)
    pick = picker(slot)
    for _ in range(4):
        await adm.acquire(pick, STANDARD)
    with pytest.raises(Overloaded) as refused:  # it waits its queue_timeout, then 429
        await adm.acquire(pick, STANDARD)
    assert refused.value.status == 429 and "(standard class)" in str(refused.value)
    assert await adm.acquire(pick, INTERACTIVE) is slot  # at once: the slot it holds back
    assert adm.used == {"interactive": 1, "standard": 4, "batch": 0}


async def test_at_a_full_queue_the_newest_batch_waiter_is_shed_for_an_interactive_one() -> None:
    adm = Admission(2, 5.0, 7, limit=1, classes=classes())
    slot = Slot(cap=1)
    pick = picker(slot)
    await adm.acquire(pick, STANDARD)
    old = asyncio.create_task(adm.acquire(pick, BATCH))
    await queued(adm, 1)
    new = asyncio.create_task(adm.acquire(pick, BATCH))
    await queued(adm, 2)  # [admission].queue_size: every class's waiters together
    urgent = asyncio.create_task(adm.acquire(pick, INTERACTIVE))
    with pytest.raises(Overloaded) as shed:
        await new
    assert shed.value.status == 429 and shed.value.headers() == {"Retry-After": "7"}
    assert "shed to make room" in str(shed.value)
    assert not old.done() and adm.queued == 2
    adm.release(slot, "standard")
    assert await asyncio.wait_for(urgent, 1.0) is slot
    adm.release(slot, "interactive")
    assert await asyncio.wait_for(old, 1.0) is slot


async def test_each_class_waits_its_own_time() -> None:
    adm = Admission(16, 5.0, 1, limit=1, classes=classes(timeout=0.05, batch_timeout=0.4))
    slot = Slot(cap=1)
    pick = picker(slot)
    await adm.acquire(pick, STANDARD)
    batch = asyncio.create_task(adm.acquire(pick, BATCH))
    with pytest.raises(Overloaded):
        await adm.acquire(pick, STANDARD)  # its 50 ms run out first
    await asyncio.sleep(0.1)
    assert not batch.done()  # a lower class waits longer, but a bounded time
    adm.release(slot, "standard")
    assert await asyncio.wait_for(batch, 1.0) is slot


async def test_a_flooding_tenant_does_not_hold_back_another_in_its_class() -> None:
    adm = Admission(64, 5.0, 1, limit=1, classes=classes(queue=64))
    slot = Slot(cap=1)
    pick = picker(slot)
    await adm.acquire(pick, STANDARD)
    served: list[str] = []

    async def wait(tenant: str) -> None:
        ask = Ask("standard", tenant, 100)
        await adm.acquire(pick, ask)
        served.append(tenant)
        await asyncio.sleep(0)
        adm.release(slot, "standard", None, tenant)

    flood = [asyncio.create_task(wait("a")) for _ in range(10)]
    await queued(adm, 10)
    steady = asyncio.create_task(wait("b"))  # arrives behind ten of a's
    await queued(adm, 11)
    adm.release(slot, "standard")
    await asyncio.gather(*flood, steady)
    assert served.index("b") <= 1, served  # served within a's first two, not after ten


async def test_a_placed_waiter_whose_client_left_gives_its_slot_back() -> None:
    adm = Admission(16, 5.0, 1, limit=1, classes=classes())
    slot = Slot(cap=1)
    pick = picker(slot)
    await adm.acquire(pick, STANDARD)
    first = asyncio.create_task(adm.acquire(pick, INTERACTIVE))
    second = asyncio.create_task(adm.acquire(pick, BATCH))
    await queued(adm, 2)
    adm.release(slot, "standard")  # places `first` ...
    first.cancel()  # ... whose client leaves before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1.0) is slot
    assert adm.used == {"interactive": 0, "standard": 0, "batch": 1} and adm.inflight == 1


async def test_with_no_unit_to_serve_it_a_request_is_refused_at_once_in_any_class() -> None:
    adm = Admission(16, 5.0, 1, limit=4, classes=classes(reserved=0.5))

    def pick() -> Slot | None:
        raise Overloaded("none", status=503, code="no_routable_unit", retry_after=1)

    for ask in (INTERACTIVE, STANDARD, BATCH):
        with pytest.raises(Overloaded) as err:
            await asyncio.wait_for(adm.acquire(pick, ask), 1.0)
        assert err.value.status == 503
    assert adm.inflight == 0 and adm.queued == 0


async def test_the_capacity_is_measured_again_when_routability_changes() -> None:
    """The reserved share is of the units in service: with 10 slots, 20% is 2 held back."""
    capacity = [5]
    adm = Admission(16, 0.05, 1, classes=classes(0.2, timeout=0.05), capacity=lambda: capacity[0])
    slot = Slot(cap=100)
    pick = picker(slot)
    for _ in range(4):
        await adm.acquire(pick, STANDARD)
    capacity[0] = 10
    adm.wake_all()
    for _ in range(4):
        await adm.acquire(pick, STANDARD)
    with pytest.raises(Overloaded):
        await adm.acquire(pick, STANDARD)  # 8 used, 2 held back for interactive


class Request:
    """A Holder: the request's task, cancelled when preempted."""

    def __init__(self) -> None:
        self.started = False
        self.preempted = False
        self.task: asyncio.Task[object] | None = None

    def preempt(self) -> None:
        self.preempted = True
        assert self.task is not None
        self.task.cancel()


async def test_a_waiting_interactive_request_preempts_the_newest_unstarted_batch_one() -> None:
    config = classes()
    config = PriorityConfig(classes=config.classes, preempt=True)
    adm = Admission(16, 5.0, 1, limit=3, classes=config)
    slot = Slot(cap=3)
    pick = picker(slot)
    holders = [Request() for _ in range(3)]
    gate = asyncio.Event()

    async def hold(h: Request) -> None:
        await adm.acquire(pick, BATCH, h)
        try:
            await gate.wait()
        finally:
            adm.release(slot, "batch", h)

    for h in holders:
        h.task = asyncio.create_task(hold(h))
        await asyncio.sleep(0)
    holders[0].started = True  # its answer is on its way: never preempted
    assert slot.inflight == 3
    urgent = await asyncio.wait_for(adm.acquire(pick, INTERACTIVE, Request()), 1.0)
    assert urgent is slot
    assert [h.preempted for h in holders] == [False, False, True]  # the newest unstarted
    assert holders[2].task is not None and holders[2].task.cancelled()
    assert adm.used == {"interactive": 1, "standard": 0, "batch": 2}
    gate.set()
    await asyncio.gather(*(h.task for h in holders[:2] if h.task is not None))
    adm.release(slot, "interactive")
    assert adm.inflight == 0 and slot.inflight == 0


async def test_without_preempt_nobody_is_cancelled() -> None:
    adm = Admission(16, 5.0, 1, limit=1, classes=classes(timeout=0.05))
    slot = Slot(cap=1)
    holder = Request()
    await adm.acquire(picker(slot), BATCH, holder)
    with pytest.raises(Overloaded):
        await adm.acquire(picker(slot), INTERACTIVE, Request())
    assert not holder.preempted

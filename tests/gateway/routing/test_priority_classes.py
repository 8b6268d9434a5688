"""Admission over priority classes on a fake clock: order, reservation, waits, shedding."""

from __future__ import annotations

import itertools

import pytest

from gateway.config.priority import PriorityClass, PriorityConfig
from gateway.routing.classes import ADMIT, ClassQueues, Entry, Queue, Running, Shed, Slots
from gateway.routing.reserve import fits, held_back, reserved

CONFIG = PriorityConfig()  # interactive (20% reserved, 5 s), standard (5 s), batch (60 s)
FULL = Slots(capacity=10, used={"standard": 10})
_ids = itertools.count()


def entry(klass: str, tenant: str = "t", since: float = 0.0, tokens: int = 100) -> Entry[int]:
    return Entry(next(_ids), klass, tenant, tokens, since)


def queues(limit: int = 1024, config: PriorityConfig = CONFIG) -> ClassQueues[int]:
    return ClassQueues(config, limit)


# Reservation (reserve.py)


def test_a_reservation_is_whole_slots_rounded_down() -> None:
    assert reserved(0.2, 10) == 2
    assert reserved(0.1, 30) == 3  # 0.1 * 30 = 3.0000000000000004
    assert reserved(0.2, 4) == 0  # a small fleet keeps every slot for everyone


def test_reserved_slots_are_held_back_from_less_important_classes_only() -> None:
    ranked = CONFIG.ranked
    used = {"standard": 7}
    assert held_back(ranked, "standard", 10, used) == 2
    assert fits(ranked, "standard", 10, used)  # 2 free after it: the reservation
    used = {"standard": 8}
    assert not fits(ranked, "standard", 10, used)
    assert not fits(ranked, "batch", 10, used)
    assert fits(ranked, "interactive", 10, used)  # its own reservation does not hold it back
    assert fits(ranked, "interactive", 10, {"standard": 9})
    assert not fits(ranked, "interactive", 10, {"standard": 10})


def test_a_class_using_its_reservation_holds_nothing_back() -> None:
    ranked = CONFIG.ranked
    assert fits(ranked, "batch", 10, {"interactive": 2, "standard": 7})
    assert held_back(ranked, "batch", 10, {"interactive": 1, "standard": 7}) == 1
    with pytest.raises(KeyError):
        held_back(ranked, "gold", 10, {})


def test_reservations_hold_back_from_every_class_below() -> None:
    config = PriorityConfig(
        classes=(
            PriorityClass("a", 0, reserved_share=0.2),
            PriorityClass("b", 1, reserved_share=0.3),
            PriorityClass("c", 2),
        ),
        default="c",
    )
    assert held_back(config.ranked, "b", 10, {}) == 2
    assert held_back(config.ranked, "c", 10, {}) == 5
    assert fits(config.ranked, "c", 10, {"c": 4}) and not fits(config.ranked, "c", 10, {"c": 5})


# Offer and next: order by rank, no overtaking


def test_an_arrival_on_an_idle_gateway_is_admitted() -> None:
    q = queues()
    assert q.offer(entry("batch"), Slots(10)) is ADMIT
    assert len(q) == 0


def test_freed_slots_go_to_the_most_important_class_first() -> None:
    q = queues()
    waiters = [entry(k, since=i) for i, k in enumerate(["batch", "standard", "interactive"])]
    for e in waiters:
        assert q.offer(e, FULL) == Queue()
    order = [q.next(1.0, Slots(10, {"standard": 5})) for _ in range(3)]
    assert [e.klass for e in order if e] == ["interactive", "standard", "batch"]
    assert q.next(1.0, Slots(10)) is None


def test_an_arrival_does_not_overtake_waiters_of_its_class_or_above() -> None:
    q = queues()
    q.offer(entry("standard"), FULL)
    room = Slots(10, {"standard": 1})
    assert isinstance(q.offer(entry("standard", since=1), room), Queue)
    assert isinstance(q.offer(entry("batch", since=1), room), Queue)
    assert q.offer(entry("interactive", since=1), room) is ADMIT  # lower waiters never hold it


def test_the_reservation_keeps_lower_classes_waiting_while_the_top_gets_in() -> None:
    q = queues()
    at_reserve = Slots(10, {"standard": 8})
    standard = entry("standard")
    assert q.offer(standard, at_reserve) == Queue()
    assert q.next(0.5, at_reserve) is None  # a freed slot would eat the reservation
    assert q.offer(entry("interactive"), at_reserve) is ADMIT
    # A standard request finished; interactive now uses its reservation: the slot is free.
    assert q.next(0.5, Slots(10, {"standard": 7, "interactive": 2})) is standard


def test_a_waiter_the_freed_slot_cannot_take_is_passed_over_not_lost() -> None:
    q = queues()
    a, b = entry("interactive", "t1"), entry("standard", "t2")
    q.offer(a, FULL)
    q.offer(b, FULL)
    room = Slots(10, {"standard": 5})
    assert q.next(0.1, room, eligible=lambda e: e is not a) is b  # a's model has no room
    assert q.next(0.1, room) is a


def test_an_arrival_no_unit_can_take_waits() -> None:
    q = queues()
    assert q.offer(entry("standard"), Slots(10), eligible=lambda e: False) == Queue()


# Bounded waits


def test_every_class_waits_a_bounded_time_of_its_own() -> None:
    q = queues()
    top, mid, low = entry("interactive"), entry("standard", since=1.0), entry("batch")
    for e in (top, mid, low):
        q.offer(e, FULL)
    assert q.deadline(low) == 60.0
    assert q.expired(4.9) == []
    assert q.expired(5.0) == [top]
    assert q.next(6.0, Slots(10)) is low  # standard is past its deadline: not admitted
    assert q.expired(6.0) == [mid]
    assert len(q) == 0


def test_the_expired_batch_waiter_goes_at_its_own_deadline() -> None:
    q = queues()
    low = entry("batch", since=10.0)
    q.offer(low, FULL)
    assert q.expired(69.9) == [] and q.expired(70.0) == [low]


def test_a_class_that_does_not_wait_is_shed_at_once() -> None:
    config = PriorityConfig(
        classes=(PriorityClass("now", 0, queue_timeout=0.0), PriorityClass("later", 1)),
        default="later",
    )
    q = queues(config=config)
    shed = q.offer(entry("now"), Slots(1, {"later": 1}))
    assert isinstance(shed, Shed) and "does not wait" in shed.reason


def test_a_waiter_that_left_is_removed_once() -> None:
    q = queues()
    e = entry("standard")
    q.offer(e, FULL)
    assert q.remove(e) and not q.remove(e)
    assert q.next(0.0, Slots(10)) is None


# Shedding at saturation


def test_at_saturation_the_lowest_class_is_shed_first_newest_first() -> None:
    q = queues(limit=3)
    b1, b2, s1 = entry("batch", since=1), entry("batch", since=2), entry("standard", since=3)
    for e in (b1, b2, s1):
        assert q.offer(e, FULL) == Queue()
    assert q.offer(entry("interactive"), FULL) == Queue(displaced=b2)
    assert q.offer(entry("interactive"), FULL) == Queue(displaced=b1)
    assert q.offer(entry("interactive"), FULL) == Queue(displaced=s1)
    assert q.waiting("interactive") == 3
    shed = q.offer(entry("interactive"), FULL)  # nobody below it left, and one tenant
    assert isinstance(shed, Shed) and "wait queue is full" in shed.reason
    assert isinstance(q.offer(entry("batch"), FULL), Shed)


def test_a_full_class_sheds_the_arrival_but_a_flood_sheds_its_own() -> None:
    config = PriorityConfig(
        classes=(PriorityClass("only", 0, queue_size=4),), default="only", preempt=False
    )
    q = queues(config=config)
    flood = [entry("only", "a", since=i) for i in range(4)]
    for e in flood:
        q.offer(e, Slots(1, {"only": 1}))
    shed = q.offer(entry("only", "a", since=5), Slots(1, {"only": 1}))
    assert isinstance(shed, Shed) and "only queue is full" in shed.reason
    b1, b2 = entry("only", "b", since=6), entry("only", "b", since=7)
    assert q.offer(b1, Slots(1, {"only": 1})) == Queue(displaced=flood[3])
    assert q.offer(b2, Slots(1, {"only": 1})) == Queue(displaced=flood[2])
    # a: 2 waiting, b: 2; a third of b's would make b the flood: it is shed instead.
    assert isinstance(q.offer(entry("only", "b", since=8), Slots(1, {"only": 1})), Shed)


# Preemption


def _running() -> list[Running[str]]:
    return [
        Running("batch-streaming", "batch", started=True, since=1.0),
        Running("batch-old", "batch", started=False, since=2.0),
        Running("batch-new", "batch", started=False, since=3.0),
        Running("standard-new", "standard", started=False, since=4.0),
    ]


def test_preemption_is_off_unless_configured() -> None:
    q = queues()
    q.offer(entry("interactive"), FULL)
    assert q.preempt_candidate(0.0, _running()) is None


def test_a_top_waiter_preempts_the_newest_unstarted_request_of_the_lowest_class() -> None:
    q = queues(config=PriorityConfig(preempt=True))
    assert q.preempt_candidate(0.0, _running()) is None  # nobody waits
    q.offer(entry("standard"), FULL)
    assert q.preempt_candidate(0.0, _running()) is None  # only the top class preempts
    q.offer(entry("interactive"), FULL)
    victim = q.preempt_candidate(0.0, _running())
    assert victim is not None and victim.handle == "batch-new"
    assert q.preempt_candidate(0.0, _running(), releasing=1) is None  # its slot is on its way
    assert q.preempt_candidate(5.0, _running()) is None  # the waiter is past its deadline


def test_a_request_that_has_started_is_never_preempted() -> None:
    q = queues(config=PriorityConfig(preempt=True))
    q.offer(entry("interactive"), FULL)
    running = [r for r in _running() if r.started or r.klass != "batch"]
    assert q.preempt_candidate(0.0, running) is None

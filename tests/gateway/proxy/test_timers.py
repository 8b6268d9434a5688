"""TimerSlots: many objects' timers on one loop timer per slot in use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from gateway.proxy.timers import TimerSlots
from tests.gateway.fake_loop import FakeLoop


class _Entry:
    def __init__(self, loop: FakeLoop, name: str, seen: list[tuple[str, float]]) -> None:
        self.loop, self.name, self.seen = loop, name, seen
        self.then: Callable[[], None] | None = None

    def due(self) -> None:
        self.seen.append((self.name, self.loop.time()))
        if self.then is not None:
            self.then()


def _slots(resolution: float = 0.05) -> tuple[FakeLoop, TimerSlots, list[tuple[str, float]]]:
    loop = FakeLoop()
    return loop, TimerSlots(loop, resolution), []  # type: ignore[arg-type]


def test_an_entry_is_due_at_or_after_its_time_and_at_most_one_slot_late() -> None:
    loop, timers, seen = _slots(0.05)
    a = _Entry(loop, "a", seen)
    timers.add(100.21, a)
    loop.advance(100.2099)
    assert seen == []
    loop.advance(101.0)
    assert len(seen) == 1
    assert 100.21 <= seen[0][1] <= 100.21 + 0.05


def test_entries_in_one_slot_share_one_loop_timer() -> None:
    loop, timers, seen = _slots(0.05)
    for i in range(100):
        timers.add(100.201 + i * 0.0004, _Entry(loop, str(i), seen))
    assert len(loop.armed()) == 1
    assert timers.waiting() == 100
    loop.advance(100.3)
    assert sorted(int(name) for name, _ in seen) == list(range(100))
    assert timers.waiting() == 0


def test_the_last_entry_out_gives_the_loop_timer_back() -> None:
    loop, timers, seen = _slots()
    a, b = _Entry(loop, "a", seen), _Entry(loop, "b", seen)
    slot_a, slot_b = timers.add(101.0, a), timers.add(101.0, b)
    assert slot_a == slot_b
    timers.discard(slot_a, a)
    assert len(loop.armed()) == 1  # b still waits
    timers.discard(slot_b, b)
    assert loop.armed() == []
    assert timers.waiting() == 0
    timers.discard(slot_b, b)  # again, or after it fired: nothing
    loop.advance(102.0)
    assert seen == []


def test_an_entry_that_asks_again_from_due_is_due_again_later() -> None:
    loop, timers, seen = _slots()
    a = _Entry(loop, "a", seen)
    rounds = iter(range(2))

    def again() -> None:
        if next(rounds, None) is not None:
            timers.add(loop.time() + 1.0, a)

    a.then = again
    timers.add(100.5, a)
    loop.advance(110.0)
    assert [round(t, 2) for _, t in seen] == [100.5, 101.5, 102.5]
    assert loop.armed() == []


def test_one_failing_entry_does_not_leave_the_others_unwatched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop, timers, seen = _slots()
    bad = _Entry(loop, "bad", seen)

    def fail() -> None:
        raise RuntimeError("boom")

    bad.then = fail
    timers.add(100.5, bad)
    for name in "xyz":
        timers.add(100.5, _Entry(loop, name, seen))
    with caplog.at_level(logging.ERROR, logger="gateway.proxy.timers"):
        loop.advance(101.0)
    assert sorted(name for name, _ in seen) == ["bad", "x", "y", "z"]
    assert "a timer's callback failed" in caplog.text


def test_close_cancels_every_loop_timer() -> None:
    loop, timers, seen = _slots()
    for i in range(5):
        timers.add(100.0 + i, _Entry(loop, str(i), seen))
    assert len(loop.armed()) == 5
    timers.close()
    assert loop.armed() == []
    loop.advance(200.0)
    assert seen == []


def test_a_resolution_that_is_not_positive_is_refused_by_value() -> None:
    with pytest.raises(ValueError, match="not 0"):
        TimerSlots(None, 0)


async def test_on_a_real_loop_it_binds_to_the_running_loop_and_fires() -> None:
    loop = asyncio.get_running_loop()
    timers = TimerSlots(resolution=0.01)
    fired = loop.create_future()

    class Entry:
        def due(self) -> None:
            fired.set_result(loop.time())

    asked = loop.time() + 0.03
    timers.add(asked, Entry())
    assert timers.loop is loop
    when = await asyncio.wait_for(fired, 2.0)
    assert when >= asked - 0.002  # the loop's clock runs timers up to a millisecond early
    assert timers.waiting() == 0

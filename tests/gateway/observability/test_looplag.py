"""The loop-lag timer's cadence, on a fake loop: 50 ms after a late tick, doubling while the
loop is on time (up to 0.5 s), and 50 ms while a deadline that reads the total is out."""

from __future__ import annotations

import pytest

from gateway.observability.looplag import ON_TIME_S, LoopLag, next_gap
from tests.gateway.fake_loop import FakeLoop


def started(every: float = 0.05, idle_every: float = 0.5) -> tuple[LoopLag, FakeLoop]:
    lag, loop = LoopLag(every, idle_every), FakeLoop()
    lag.start(loop)  # type: ignore[arg-type]
    return lag, loop


def test_the_gap_doubles_while_on_time_and_drops_after_a_late_tick() -> None:
    assert next_gap(0.05, 0.0, False, 0.05, 0.5) == 0.1
    assert next_gap(0.4, ON_TIME_S, False, 0.05, 0.5) == 0.5
    assert next_gap(0.5, 0.0, False, 0.05, 0.5) == 0.5
    assert next_gap(0.5, ON_TIME_S + 0.001, False, 0.05, 0.5) == 0.05
    assert next_gap(0.5, 0.0, True, 0.05, 0.5) == 0.05


def test_an_idle_loop_is_woken_twice_a_second() -> None:
    lag, loop = started()
    gaps = []
    for _ in range(8):
        before = loop.due()
        loop.run_next()
        gaps.append(round(loop.due() - before, 6))
    assert gaps == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert lag.total == 0.0 and lag.histogram.count == 8


def test_a_late_tick_is_counted_and_brings_the_short_gap_back() -> None:
    lag, loop = started()
    for _ in range(5):
        loop.run_next()
    loop.run_next(late=0.3)  # the loop was stuck
    assert lag.total == pytest.approx(0.3) and lag.max == pytest.approx(0.3)
    assert loop.due() == pytest.approx(loop.now + 0.05)


def test_hurry_keeps_the_short_gap_until_the_deadline_has_passed() -> None:
    lag, loop = started()
    for _ in range(5):
        loop.run_next()
    assert loop.due() - loop.now == pytest.approx(0.5)
    lag.hurry(loop.now + 0.27)  # between ticks: no float rounding at the boundary
    assert loop.due() == pytest.approx(loop.now + 0.05)  # re-armed sooner
    ticks = []
    for _ in range(8):
        loop.run_next()
        ticks.append(round(loop.due() - loop.now, 6))
    # 50 ms apart while the deadline is out, then doubling again
    assert ticks == [0.05, 0.05, 0.05, 0.05, 0.05, 0.1, 0.2, 0.4]


def test_hurry_never_puts_a_due_tick_off() -> None:
    lag, loop = started()
    due = loop.due()
    lag.hurry(loop.now + 10.0)
    assert loop.due() == due  # it was due sooner than 50 ms from now anyway


def test_hurry_before_start_is_kept_for_the_first_ticks() -> None:
    lag, loop = LoopLag(), FakeLoop()
    lag.hurry(loop.now + 1.0)
    lag.start(loop)  # type: ignore[arg-type]
    loop.run_next()
    assert loop.due() - loop.now == pytest.approx(0.05)


def test_the_cadence_must_make_sense() -> None:
    with pytest.raises(ValueError, match="every <= idle_every"):
        LoopLag(every=0.5, idle_every=0.05)
    with pytest.raises(ValueError, match="every <= idle_every"):
        LoopLag(every=0.0)

"""The pace rule on a fake clock: a stream is quiet by its own gap between reads, with a
floor; a unit's traffic flows while an answer began lately or one of its streams keeps pace."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.proxy.live import LiveStreams
from gateway.relay.pace import GAP_WEIGHT, is_quiet, next_gap, quiet_after

FLOOR, FACTOR = 1.0, 4.0


def test_the_gap_estimate_follows_recent_gaps() -> None:
    gap = next_gap(None, 1.0)
    assert gap == 1.0
    gap = next_gap(gap, 0.2)
    assert gap == 1.0 + GAP_WEIGHT * (0.2 - 1.0)
    for _ in range(30):
        gap = next_gap(gap, 0.02)
    assert abs(gap - 0.02) < 1e-3


def test_quiet_is_several_of_the_streams_own_gaps_and_never_below_the_floor() -> None:
    assert quiet_after(None, FLOOR, FACTOR) == FLOOR  # no gap seen yet
    assert quiet_after(0.02, FLOOR, FACTOR) == FLOOR  # 20 ms tokens: the floor rules
    assert quiet_after(1.0, FLOOR, FACTOR) == 4.0  # 1 token/s: quiet after 4 s, not 1 s
    assert not is_quiet(10.0, 7.0, 1.0, FLOOR, FACTOR)  # 3 s since a 1 s-paced token
    assert is_quiet(11.1, 7.0, 1.0, FLOOR, FACTOR)
    assert is_quiet(8.01, 7.0, 0.02, FLOOR, FACTOR)  # a fast stream silent for 1 s


@dataclass(eq=False)
class Stream:
    last: float
    gap: float | None
    ejected: str | None = None

    def on_unit_ejected(self, reason: str) -> bool:
        self.ejected = reason
        return True

    def pace(self) -> tuple[float, float | None] | None:
        return self.last, self.gap


def test_a_unit_flows_while_one_of_its_streams_keeps_its_pace() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    assert not live.flowing("u0", 100.0)
    slow, fast = Stream(last=97.0, gap=1.0), Stream(last=95.0, gap=0.02)
    live.add("u0", fast)
    assert not live.flowing("u0", 100.0)  # a fast stream silent for 5 s: stalled
    live.add("u0", slow)
    assert live.flowing("u0", 100.0)  # a 1 s-paced stream 3 s after its token: fine
    assert not live.flowing("u0", 101.5)
    assert not live.flowing("u1", 100.0)
    assert live.eject("u0", "probes") == 2 and slow.ejected == fast.ejected == "probes"
    live.discard("u0", slow)
    live.discard("u0", fast)
    assert live.count() == 0


def test_an_answer_that_began_lately_vouches_for_its_unit() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    live.began("u0", 50.0)
    assert live.flowing("u0", 50.9) and not live.flowing("u0", 51.1)
    live.forget("u0")
    assert not live.flowing("u0", 50.5)

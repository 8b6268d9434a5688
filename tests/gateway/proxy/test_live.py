"""LiveStreams on an explicit clock: streams in flight per unit, what an ejection reaches, and
whether a unit's traffic flows (an answer that began or completed lately, or a stream keeping
its own pace by the rule in relay/pace.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from gateway.outcomes import End
from gateway.paths import COMPLETIONS_PATH
from gateway.proxy.call import Call
from gateway.proxy.lease import Lease
from gateway.proxy.live import LiveStreams
from gateway.relay.pace import is_quiet
from gateway.server import Gateway
from tests.support import gateway_config

FLOOR, FACTOR = 1.0, 4.0


@dataclass(eq=False)
class Stream:
    """A relay as LiveStreams sees it; `last` None is a stream between two answers."""

    last: float | None = None
    gap: float | None = None
    breaks: bool = True  # what it answers to an ejection
    told: list[str] = field(default_factory=list)
    asked: int = 0  # how often its pace was read
    live: LiveStreams | None = None  # set: it leaves `live` when told (as a finished relay does)
    unit: str = "u0"

    def on_unit_ejected(self, reason: str) -> bool:
        self.told.append(reason)
        if self.live is not None:
            self.live.discard(self.unit, self)
        return self.breaks

    def pace(self) -> tuple[float, float | None] | None:
        self.asked += 1
        return None if self.last is None else (self.last, self.gap)


def test_streams_are_counted_per_unit_and_in_all() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    a, b, c = Stream(), Stream(), Stream()
    assert live.count() == 0 and live.count("u0") == 0
    live.add("u0", a)
    live.add("u0", b)
    live.add("u0", a)  # the same stream once
    live.add("u1", c)
    assert (live.count("u0"), live.count("u1"), live.count("u2"), live.count()) == (2, 1, 0, 3)
    live.discard("u0", a)
    assert (live.count("u0"), live.count()) == (1, 2)
    live.discard("u0", b)
    assert (live.count("u0"), live.count("u1"), live.count()) == (0, 1, 1)
    # A unit's last stream gone takes its entry along: no empty set per unit ever served.
    assert "u0" not in live._by_unit


def test_discarding_a_stream_that_is_not_there_changes_nothing() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    kept, stranger = Stream(), Stream()
    live.add("u0", kept)
    live.discard("u0", stranger)  # not on the unit
    live.discard("u1", kept)  # on another unit
    live.discard("u9", stranger)  # a unit never seen
    assert (live.count("u0"), live.count()) == (1, 1)
    assert set(live._by_unit) == {"u0"}  # no entry made for u1 or u9
    live.discard("u0", kept)
    live.discard("u0", kept)  # twice: still fine
    assert live.count() == 0


def test_an_answer_that_began_within_the_floor_vouches_for_its_unit() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    assert not live.flowing("u0", 10.0)
    live.began("u0", 10.0)
    assert live.count("u0") == 0  # an answer began; no stream is added by it
    assert live.flowing("u0", 10.0)
    assert live.flowing("u0", 11.0)  # the floor itself still counts
    assert not live.flowing("u0", 11.25)
    assert not live.flowing("u1", 10.5)  # per unit
    live.began("u0", 12.0)  # the latest answer is the one that counts
    assert live.flowing("u0", 12.75)
    live.began("u1", 12.0)
    live.forget("u0")  # the unit was removed
    assert not live.flowing("u0", 12.5)
    assert live.flowing("u1", 12.5)


def test_an_answer_that_completed_within_the_floor_vouches_for_its_unit() -> None:
    """A wave of streams that all just ended, the next not yet begun: no stream is in flight
    and the last began over a floor ago, but the unit served a moment ago."""
    live = LiveStreams(FLOOR, FACTOR)
    live.began("u0", 10.0)
    live.completed("u0", 11.5)
    assert live.flowing("u0", 12.5) and not live.flowing("u0", 12.75)
    assert live.flowing_for("u0", 12.0) == pytest.approx(0.5)
    assert not live.flowing("u1", 12.0)  # per unit
    live.forget("u0")
    assert not live.flowing("u0", 12.0)


async def test_only_an_answer_that_ended_complete_vouches() -> None:
    """Through the gateway's own signals: its LiveStreams hears how answers end."""
    units = [{"id": "u0", "leader": "http://127.0.0.1:1", "nodes": ["http://127.0.0.1:1"]}]
    gateway = Gateway(gateway_config(units))
    live, unit = gateway.live, gateway.units.units["u0"]
    now = asyncio.get_running_loop().time()
    start = now - 10.0
    request = Call(COMPLETIONS_PATH, "r1", {}, start, start + 60, Lease(gateway.admission))
    for end in End:
        if end is not End.COMPLETE:
            gateway.signals.answer_ended(request, unit, end, None)
    assert not live.flowing("u0", now)  # a broken, cut or abandoned answer proves nothing
    gateway.signals.answer_ended(request, unit, End.COMPLETE, None)
    assert live.flowing("u0", now) and live.count("u0") == 0


def test_began_uses_the_floor_it_was_built_with() -> None:
    live = LiveStreams(0.25, FACTOR)
    live.began("u0", 10.0)
    assert live.flowing("u0", 10.25) and not live.flowing("u0", 10.5)


@pytest.mark.parametrize(
    ("gap", "quiet_after"),
    [
        (None, FLOOR),  # no gap seen yet: the floor
        (0.01, FLOOR),  # a fast stream: never quiet sooner than the floor
        (0.5, 0.5 * FACTOR),  # a slow one: FACTOR of its own gap
    ],
)
def test_a_stream_vouches_for_its_unit_until_quiet_by_its_own_pace(
    gap: float | None, quiet_after: float
) -> None:
    live = LiveStreams(FLOOR, FACTOR)
    live.add("u0", Stream(last=10.0, gap=gap))
    assert live.flowing("u0", 10.0)
    assert live.flowing("u0", 10.0 + quiet_after - 0.25)
    assert live.flowing("u0", 10.0 + quiet_after)  # quiet only once past it
    assert not live.flowing("u0", 10.0 + quiet_after + 0.25)


def test_flowing_is_the_pace_rule_with_the_configured_floor_and_factor() -> None:
    floor, factor = 0.5, 2.0
    live = LiveStreams(floor, factor)
    stream = Stream()
    live.add("u0", stream)
    for gap in (None, 0.05, 0.2, 0.3, 1.0):
        for last in (0.0, 3.0):
            stream.last, stream.gap = last, gap
            for now in (3.0, 3.25, 3.5, 3.625, 4.0, 5.0, 6.5):
                quiet = is_quiet(now, last, gap, floor, factor)
                assert live.flowing("u0", now) is not quiet, (gap, last, now)
    stream.last, stream.gap = 10.0, 0.5
    assert live.flowing("u0", 10.875) and not live.flowing("u0", 11.125)  # 2 x 0.5, not 4 x


def test_one_stream_keeping_pace_is_enough_and_a_stream_between_answers_is_none() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    idle, stalled, paced = Stream(), Stream(last=5.0, gap=0.02), Stream(last=9.0, gap=1.0)
    live.add("u0", idle)
    live.add("u0", stalled)
    assert not live.flowing("u0", 10.0)
    live.add("u0", paced)
    assert live.flowing("u0", 10.0)  # 1 s after a token that comes about every second
    live.discard("u0", paced)
    assert not live.flowing("u0", 10.0)


def test_flowing_reads_only_the_asked_units_streams() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    mine, other = Stream(last=9.5), Stream(last=9.5)
    live.add("u0", mine)
    live.add("u1", other)
    assert live.flowing("u0", 10.0)
    assert mine.asked == 1 and other.asked == 0


def test_an_ejection_tells_every_stream_on_the_unit_and_counts_those_that_will_break() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    resumable, plain, elsewhere = Stream(), Stream(breaks=False), Stream()
    live.add("u0", resumable)
    live.add("u0", plain)
    live.add("u1", elsewhere)
    assert live.eject("u0", "probes failed") == 1
    assert resumable.told == plain.told == ["probes failed"] and elsewhere.told == []
    assert live.count("u0") == 2  # told, not removed: each leaves when its relay ends
    assert live.eject("u9", "never seen") == 0


def test_a_stream_that_leaves_while_told_of_an_ejection_does_not_upset_it() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    leaving = [Stream(live=live) for _ in range(3)]
    for stream in leaving:
        live.add("u0", stream)
    assert live.eject("u0", "stalled") == 3
    assert all(s.told == ["stalled"] for s in leaving)
    assert live.count() == 0


def test_forgetting_a_unit_leaves_its_streams_alone() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    stream = Stream(last=10.0)
    live.add("u0", stream)
    live.began("u0", 10.0)
    live.forget("u0")
    assert live.count("u0") == 1 and live.flowing("u0", 10.5)
    live.forget("u9")  # a unit never seen


def test_the_gateway_judges_traffic_by_its_traffic_window_not_the_ejection_floor() -> None:
    """[health].traffic_window is the window `flowing` uses; [resume].ejected_idle is only the
    relay's floor for streams on an ejected unit (they were once the same value, wired from
    the wrong key)."""
    units = [{"id": "u0", "leader": "http://127.0.0.1:1", "nodes": ["http://127.0.0.1:1"]}]
    config = gateway_config(
        units, health={"traffic_window": 7.5, "pace_factor": 3.0}, resume={"ejected_idle": 0.5}
    )
    live = Gateway(config).live
    assert (live.floor, live.factor) == (7.5, 3.0)
    live.began("u0", 100.0)
    assert live.flowing("u0", 107.0)  # within 7.5 s: an ejected_idle window would say no


def test_flowing_for_is_the_horizon_of_flowing() -> None:
    """What a worker reports: flowing holds exactly until now + flowing_for, absent new data
    (the same pace rule, evaluated ahead for a control plane in another process)."""
    live = LiveStreams(0.5, 2.0)
    live.add("u0", Stream(last=3.0, gap=1.0))  # quiet after 2 x 1 s
    live.add("u0", Stream(last=3.5, gap=0.1))  # quiet after the 0.5 s floor
    for now in (3.2, 3.9, 4.4, 4.99):
        horizon = live.flowing_for("u0", now)
        assert horizon == pytest.approx(5.0 - now)
        assert live.flowing("u0", now + horizon - 1e-9)
        assert not live.flowing("u0", now + horizon + 1e-9)
    assert live.flowing_for("u0", 5.5) == 0.0 and not live.flowing("u0", 5.5)
    live.began("u1", 7.0)  # an answer that just opened vouches for the floor
    assert live.flowing_for("u1", 7.2) == pytest.approx(0.3)
    assert live.flowing_for("u2", 7.2) == 0.0


def test_progress_since_counts_data_and_completions_not_first_bytes() -> None:
    """What vouches for a follower whose probe timed out while its leader answered: progress
    made after the probe went out (`since`). Earlier traffic, however recent, does not."""
    live = LiveStreams(FLOOR, FACTOR)
    assert live.progressed("u0", 10.0) is None
    stream = Stream(last=9.9, gap=0.05)
    live.add("u0", stream)
    assert live.flowing("u0", 10.0)  # by the pace rule: data 0.1 s ago
    assert not live.flowing("u0", 10.0, since=9.95)  # but none since the probe went out
    assert live.progressed("u0", 10.0) == pytest.approx(0.1)
    stream.last = 9.97
    assert live.flowing("u0", 10.0, since=9.95)
    live.began("u1", 9.98)  # a head: the leader's, sent before its gang stepped
    assert live.flowing("u1", 10.0) and not live.flowing("u1", 10.0, since=9.95)
    live.completed("u1", 9.99)  # a whole answer: every node made its last token
    assert live.flowing("u1", 10.0, since=9.95)
    assert live.progressed("u1", 10.0) == pytest.approx(0.01)
    live.forget("u1")
    assert live.progressed("u1", 10.0) is None


def test_progress_stops_walking_at_a_recent_enough_stream() -> None:
    live = LiveStreams(FLOOR, FACTOR)
    streams = [Stream(last=9.0), Stream(last=9.99), Stream(last=9.5)]
    for stream in streams:
        live.add("u0", stream)
    assert live.progressed("u0", 10.0) == pytest.approx(0.01)  # the newest of all three
    for stream in streams:
        stream.asked = 0
    live.progressed("u0", 10.0, enough=0.02)
    walked = sum(stream.asked for stream in streams)
    assert 1 <= walked <= 3 and (walked == 3 or streams[1].asked == 1)

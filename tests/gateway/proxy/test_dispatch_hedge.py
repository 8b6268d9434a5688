"""Hedged requests in the dispatcher, against real leaders on 127.0.0.1: a second copy after
the delay, the first answer to begin wins, the other copy is cancelled and its unit sees its
connection go; no hedge for a request that may not have one, or when the budget says no.

The stalling unit is the heavier (the picker's first choice while both are idle), so the
first copy goes to it and the second to the unit that answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.proxy.call import Call
from gateway.proxy.hedging import first_of
from gateway.proxy.upstream import Answer
from gateway.relay.tracker import StreamTracker
from gateway.routing.forecast import Forecast, Placed
from gateway.units import UnitState
from tests.gateway.proxy import dispatch_support
from tests.gateway.proxy.dispatch_support import HEAVY, LIGHT, Make, Recorder, Rig, answering
from tests.gateway.proxy.test_dispatch_latency import learned
from tests.gateway.servers import Peer, RawServer, never, serve_app, until

FAST = {"min_delay": 0.05, "max_delay": 0.1, "budget_share": 1.0}
rigs = dispatch_support.rigs  # the shared fixture, registered here (see test_dispatch.py)


class HedgeRecorder(Recorder):
    def attempt_cancelled(self, call: Call, unit: UnitState) -> None:
        self.events.append(("cancelled", unit.id))

    def hedged(self, call: Call, first: UnitState, second: UnitState, tokens: int) -> None:
        self.events.append(("hedged", first.id, second.id))

    def hedge_refused(self, call: Call, reason: str) -> None:
        self.events.append(("refused", reason.partition(":")[0]))

    def hedge_ended(
        self, call: Call, winner: UnitState, loser: UnitState, second: bool, wasted: int
    ) -> None:
        self.events.append(("won", winner.id, second))


def hedging(rig: Rig) -> HedgeRecorder:
    seen = HedgeRecorder(rig.admission)
    rig.signals.subscribe(seen)
    return seen


def resumable(rig: Rig, headers: dict[str, str] | None = None) -> Call:
    """A call as intake leaves a resumable stream: with its tracker."""
    call = rig.call()
    call.headers = headers or {}
    call.tracker = StreamTracker(True, False, False)
    return call


def kinds(seen: HedgeRecorder) -> list[tuple[Any, ...]]:
    return [e for e in seen.events if e[0] != "started"]


async def timed_open(rig: Rig, call: Call) -> tuple[UnitState, Answer, float]:
    """The dispatcher's open of `call`, and the seconds it took."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    unit, answer = await rig.dispatcher.open(call)
    return unit, answer, loop.time() - began


async def test_a_stalled_first_copy_is_hedged_and_the_second_wins(rigs: Make) -> None:
    hits: list[str] = []
    async with RawServer(never) as stalled, serve_app(answering(hits)) as fast:
        rig = rigs([("a", stalled.url, HEAVY), ("b", fast, LIGHT)], hedge={"enabled": True, **FAST})
        seen = hedging(rig)
        call = resumable(rig)
        with call.lease:
            unit, answer, took = await timed_open(rig, call)
            assert unit.id == "b" and call.hedge == "second" and answer.status == 200
            assert 0.05 <= took < 1.0  # after the delay, long before a's first-byte timeout
            assert kinds(seen) == [
                ("hedged", "a", "b"), ("opened", "b", 200), ("cancelled", "a"), ("won", "b", True)
            ]  # fmt: skip
            # The request holds b's slot, and only it; a's is given back.
            assert call.lease.unit is rig.unit("b") and rig.admission.inflight == 1
            assert (rig.unit("a").inflight, rig.unit("b").inflight) == (0, 1)
            assert call.placed is None or call.placed.unit == "b"
            rig.upstream.finish(answer)
        assert rig.admission.inflight == 0
        await asyncio.wait_for(stalled.peers[0].closed.wait(), 1.0)  # a saw the abort
        assert call.tried == [] and call.attempts == 2


def seen_only(ttft: dict[str, float], answers: int = 6) -> Forecast:
    """A forecast that saw `answers` first tokens of each unit, too few for its models."""
    forecast = Forecast(least=20, learn_every=0.0)
    now = 100.0
    for unit, seconds in ttft.items():
        for _ in range(answers):
            placed = Placed(unit, 10, 0, None)
            forecast.sent(placed, 0, now)
            forecast.first_token(placed, now + seconds)
            now += 10.0
    assert all(forecast.estimate(unit, 10, 0) is None for unit in ttft)
    return forecast


@pytest.mark.parametrize("taught", [learned, seen_only], ids=["learned", "seen"])
async def test_a_unit_that_learned_to_stall_is_hedged_as_soon_as_the_others_answer(
    rigs: Make, taught: Callable[[dict[str, float]], Forecast]
) -> None:
    """Every request to `a` has taken 5 s to its first token, every one to `b` 50 ms: the
    delay is twice b's, not twice a's (which max_delay would cut to 10 s); from the units'
    models, or before they have learned, from what they were seen to take."""
    async with RawServer(never) as stalled, serve_app(answering([])) as fast:
        hedge = {"enabled": True, "min_delay": 0.01, "max_delay": 10.0, "budget_share": 1.0}
        rig = rigs(
            [("a", stalled.url, HEAVY), ("b", fast, LIGHT)],
            hedge=hedge,
            forecast=taught({"a": 5.0, "b": 0.05}),
        )
        seen = hedging(rig)
        call = resumable(rig)
        with call.lease:
            unit, answer, took = await timed_open(rig, call)
            assert unit.id == "b" and call.hedge == "second"
            assert ("hedged", "a", "b") in seen.events
            assert 0.05 <= took < 2.0, took  # about twice b's 50 ms, then b's answer
            rig.upstream.finish(answer)


async def test_a_copy_sent_before_anything_was_known_is_hedged_once_the_fleet_answers(
    rigs: Make,
) -> None:
    """A gateway just started knows no unit's time to first token: its first copies get
    max_delay (10 s here), asked again while they wait. The other unit's first answers come
    in 0.2 s later: the waiting copy is hedged after about twice theirs, not after 10 s."""
    async with RawServer(never) as stalled, serve_app(answering([])) as fast:
        hedge = {"enabled": True, "min_delay": 0.01, "max_delay": 10.0, "budget_share": 1.0}
        forecast = Forecast(least=20, learn_every=0.0)
        rig = rigs([("a", stalled.url, HEAVY), ("b", fast, LIGHT)], hedge=hedge, forecast=forecast)
        seen = hedging(rig)
        call = resumable(rig)
        with call.lease:
            opening = asyncio.ensure_future(timed_open(rig, call))
            await asyncio.sleep(0.2)
            assert not opening.done() and not kinds(seen)  # nothing known: no hedge yet
            now = asyncio.get_running_loop().time()
            for _ in range(6):  # b answered six requests meanwhile, each in 50 ms
                placed = Placed("b", 10, 0, None)
                forecast.sent(placed, 0, now - 0.05)
                forecast.first_token(placed, now)
            unit, answer, took = await asyncio.wait_for(opening, 5.0)
            assert unit.id == "b" and call.hedge == "second", took
            assert 0.2 <= took < 1.0, took
            rig.upstream.finish(answer)


async def test_the_first_copy_still_wins_if_it_answers_first(rigs: Make) -> None:
    held: list[Peer] = []

    def late(peer: Peer, request: bytes) -> None:
        held.append(peer)

    async with RawServer(late) as slow, RawServer(never) as silent:
        rig = rigs(
            [("a", slow.url, HEAVY), ("b", silent.url, LIGHT)], hedge={"enabled": True, **FAST}
        )
        seen = hedging(rig)
        call = resumable(rig)
        with call.lease:
            task = asyncio.create_task(rig.dispatcher.open(call))
            await until(lambda: bool(silent.peers and silent.peers[0].requests), 1.0, "hedged")
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            held[0].write(head + b"transfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n")
            unit, answer = await asyncio.wait_for(task, 1.0)
            assert unit.id == "a" and call.hedge == "first"
            assert ("won", "a", False) in seen.events and ("cancelled", "b") in seen.events
            assert call.lease.unit is rig.unit("a") and rig.unit("b").inflight == 0
            rig.upstream.finish(answer)
        await asyncio.wait_for(silent.peers[0].closed.wait(), 1.0)  # b saw the abort


async def test_a_refusal_does_not_win_over_a_stream_that_begins_later(rigs: Make) -> None:
    """The second copy's unit answers 429 at once: the first copy's stream, which begins
    later, is the client's; the 429's slot is given back."""
    held: list[Peer] = []
    hits: list[str] = []
    async with (
        RawServer(lambda peer, request: held.append(peer)) as slow,
        serve_app(answering(hits, status=429)) as busy,
    ):
        rig = rigs([("a", slow.url, HEAVY), ("b", busy, LIGHT)], hedge={"enabled": True, **FAST})
        seen = hedging(rig)
        call = resumable(rig)
        with call.lease:
            task = asyncio.create_task(rig.dispatcher.open(call))
            await until(lambda: bool(hits) and bool(held), 2.0, "both copies sent")
            await asyncio.sleep(0.05)  # the 429 is in: the race waits for a
            assert not task.done()
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            held[0].write(head + b"transfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n")
            unit, answer = await asyncio.wait_for(task, 1.0)
            assert (unit.id, answer.status, call.hedge) == ("a", 200, "first")
            assert ("won", "a", False) in seen.events
            assert rig.admission.inflight == 1 and rig.unit("b").inflight == 0
            rig.upstream.finish(answer)
        assert rig.admission.inflight == 0


@pytest.mark.parametrize(
    ("sections", "headers", "why"),
    [
        ({"hedge": {"enabled": False}}, {}, None),  # hedging off
        ({"hedge": {"enabled": True, **FAST}}, {"x-unitgate-hedge": "off"}, None),
        ({"hedge": {"enabled": True, **FAST, "budget_share": 0.0}}, {}, "budget"),
    ],
)
async def test_no_second_copy_when_it_may_not_have_one(
    rigs: Make, sections: dict[str, Any], headers: dict[str, str], why: str | None
) -> None:
    hits: list[str] = []
    async with RawServer(never) as stalled, serve_app(answering(hits)) as fast:
        rig = rigs(
            [("a", stalled.url, HEAVY), ("b", fast, LIGHT)],
            timeouts={"first_byte": 0.3},
            **sections,
        )
        seen = hedging(rig)
        call = resumable(rig, headers)
        with call.lease:
            unit, answer = await rig.dispatcher.open(call)
            rig.upstream.finish(answer)
        # a's first-byte timeout, then a retry on b: the request was not hedged.
        assert unit.id == "b" and call.hedge == ""
        assert ("failed", "a", "first_byte_timeout") in seen.events
        assert not any(e[0] in ("hedged", "won") for e in seen.events)
        assert [e[1] for e in seen.events if e[0] == "refused"] == ([why] if why else [])


async def test_a_plain_stream_is_not_hedged(rigs: Make) -> None:
    """No tracker: the stream cannot be resumed (n > 1, say), and is not hedged either."""
    hits: list[str] = []
    async with RawServer(never) as stalled, serve_app(answering(hits)) as fast:
        rig = rigs(
            [("a", stalled.url, HEAVY), ("b", fast, LIGHT)],
            timeouts={"first_byte": 0.3},
            hedge={"enabled": True, **FAST},
        )
        seen = hedging(rig)
        call = rig.call()
        with call.lease:
            unit, answer = await rig.dispatcher.open(call)
            rig.upstream.finish(answer)
        assert unit.id == "b" and not any(e[0] == "hedged" for e in seen.events)


# -- the race itself, over every order in which the two copies may end ------------------------

ENDS = st.sampled_from(["ok", "bad", "fail", "never"])  # bad: an answer, but a 429


@settings(max_examples=60, deadline=None)
@given(first=ENDS, second=ENDS, second_ends_first=st.booleans())
def test_the_first_answer_to_begin_wins_and_the_other_is_cancelled(
    first: str, second: str, second_ends_first: bool
) -> None:
    asyncio.run(_race(first, second, second_ends_first))


async def _race(first: str, second: str, second_ends_first: bool) -> None:
    gates = {name: asyncio.Event() for name in ("first", "second")}
    cancelled: list[str] = []

    async def copy(name: str, end: str) -> tuple[str, str]:
        try:
            await gates[name].wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise
        if end == "fail":
            raise RuntimeError(name)
        return name, end

    tasks = {name: asyncio.ensure_future(copy(name, end)) for name, end in
             (("first", first), ("second", second))}  # fmt: skip
    race = asyncio.ensure_future(
        first_of(tasks["first"], tasks["second"], lambda result: result[1] == "ok")
    )
    await asyncio.sleep(0)  # the race begins, as the dispatcher's does, before any copy ends
    order = ["second", "first"] if second_ends_first else ["first", "second"]
    ends = {"first": first, "second": second}
    for name in order:
        if ends[name] != "never":
            gates[name].set()
            for _ in range(10):  # this copy's end is seen before the next one's comes
                await asyncio.sleep(0)
    oks = [n for n in order if ends[n] == "ok"]
    bads = [n for n in order if ends[n] == "bad"]
    if not oks and "never" in ends.values():
        assert not race.done()  # a copy may still answer (well): the race waits for it
        race.cancel()
        await asyncio.gather(race, return_exceptions=True)
    elif oks or bads:
        (winner, end), was_second = await race
        assert winner == (oks or bads)[0] and was_second == (winner == "second")
        assert end == ("ok" if oks else "bad")  # a 429 wins only if the other failed
    else:
        with pytest.raises(RuntimeError, match="first"):  # both failed: the first's error
            await race
    assert all(t.done() for t in tasks.values())  # nothing is left running
    never = {n for n, end in ends.items() if end == "never"}
    assert never <= set(cancelled)  # a copy still waiting was cancelled, not left behind

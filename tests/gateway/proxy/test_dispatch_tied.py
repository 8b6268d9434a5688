"""Tied requests in the dispatcher, against leaders on 127.0.0.1 that announce their starts:
both copies go at once, marked tied; the first head wins and the other copy's connection is
closed before it sent anything; a unit that does not announce its starts gets the delayed
hedge; a copy that ends unstarted leaves the race to the other. Then over two real builtin
engines, one of them busy: the twin on the idle one wins, the busy one never starts its copy.

As in test_dispatch_hedge.py, unit a is the heavier: the first copy goes to it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from engine.runtime.leader import LeaderEngine
from gateway.health.kinds.unitgate import parse_health
from gateway.proxy.call import Call
from gateway.proxy.hedging import Starts
from gateway.proxy.upstream import Answer
from gateway.relay.tracker import StreamTracker
from gateway.units import UnitState
from tests.gateway.proxy import dispatch_support
from tests.gateway.proxy.dispatch_support import HEAVY, LIGHT, Make, Recorder, Rig
from tests.gateway.servers import Peer, RawServer, until
from tests.leader_support import tiny_leaders
from tests.support import MODEL

SLOW = {"min_delay": 1.0, "max_delay": 2.0, "budget_share": 1.0}  # a delayed hedge: late
TIED = b"x-unitgate-tied: 1"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
CHUNK = b"5\r\ndata:\r\n"
rigs = dispatch_support.rigs  # the shared fixture, registered here (see test_dispatch.py)


class TieRecorder(Recorder):
    def attempt_cancelled(self, call: Call, unit: UnitState) -> None:
        self.events.append(("cancelled", unit.id))

    def hedged(self, call: Call, first: UnitState, second: UnitState, tokens: int) -> None:
        self.events.append(("hedged", first.id, second.id, tokens, call.hedge))

    def hedge_refused(self, call: Call, reason: str) -> None:
        self.events.append(("refused", reason.partition(":")[0]))

    def hedge_ended(
        self, call: Call, winner: UnitState, loser: UnitState, second: bool, wasted: int
    ) -> None:
        self.events.append(("won", winner.id, loser.id, second, wasted))


def tied_rig(rigs: Make, a: str, b: str, *untied: str, **hedge: object) -> tuple[Rig, TieRecorder]:
    rig = rigs([("a", a, HEAVY), ("b", b, LIGHT)], hedge={"enabled": True, **SLOW, **hedge})
    for unit in ("a", "b"):
        rig.unit(unit).tied = unit not in untied
    seen = TieRecorder(rig.admission)
    rig.signals.subscribe(seen)
    return rig, seen


def resumable(rig: Rig) -> Call:
    call = rig.call()
    call.headers = {}
    call.tracker = StreamTracker(True, False, False)
    return call


def holding(held: list[Peer]) -> RawServer:
    return RawServer(lambda peer, request: held.append(peer))


@dataclass
class Pair:
    """Two tying units whose servers hold every request (`at_a`, `at_b`: the peers), and a
    request's dispatch under way."""

    rig: Rig
    seen: TieRecorder
    a: RawServer
    b: RawServer
    at_a: list[Peer]
    at_b: list[Peer]
    call: Call
    task: asyncio.Task[tuple[UnitState, Answer]]


@contextlib.asynccontextmanager
async def both_sent(rigs: Make) -> AsyncIterator[Pair]:
    """Yields once both copies reached their servers, which must be well before 0.5 s (a
    delayed hedge would wait 1 s)."""
    at_a: list[Peer] = []
    at_b: list[Peer] = []
    async with holding(at_a) as a, holding(at_b) as b:
        rig, seen = tied_rig(rigs, a.url, b.url)
        call = resumable(rig)
        with call.lease:
            task = asyncio.create_task(rig.dispatcher.open(call))
            await until(lambda: bool(at_a and at_b), 0.5, "both copies sent, long before 1 s")
            yield Pair(rig, seen, a, b, at_a, at_b, call, task)


async def test_both_copies_go_at_once_and_the_first_to_start_wins(rigs: Make) -> None:
    async with both_sent(rigs) as p:
        rig, call = p.rig, p.call
        assert TIED in p.a.peers[0].requests[0] and TIED in p.b.peers[0].requests[0]
        p.at_b[0].write(HEAD)  # b starts its copy: a's is closed before it sent a byte
        await asyncio.wait_for(p.a.peers[0].closed.wait(), 1.0)
        assert not p.task.done()  # b's first token is still to come
        p.at_b[0].write(CHUNK)
        unit, answer = await asyncio.wait_for(p.task, 1.0)
        assert (unit.id, answer.status, call.hedge) == ("b", 200, "tied second")
        hedged = p.seen.named("hedged")
        assert hedged == [("hedged", "a", "b", 0, "tied")]  # nothing charged up front
        assert p.seen.named("won") == [("won", "b", "a", True, 0)]  # a never started
        assert ("cancelled", "a") in p.seen.events
        assert call.lease.unit is rig.unit("b") and rig.admission.inflight == 1
        assert (rig.unit("a").inflight, rig.unit("b").inflight) == (0, 1)
        rig.upstream.finish(answer)
    assert rig.admission.inflight == 0


async def test_the_first_copy_wins_when_its_unit_starts_it_first(rigs: Make) -> None:
    async with both_sent(rigs) as p:
        p.at_a[0].write(HEAD + CHUNK)
        unit, answer = await asyncio.wait_for(p.task, 1.0)
        assert (unit.id, p.call.hedge) == ("a", "tied first")
        assert p.seen.named("won") == [("won", "a", "b", False, 0)]
        await asyncio.wait_for(p.b.peers[0].closed.wait(), 1.0)
        assert p.call.lease.unit is p.rig.unit("a") and p.rig.unit("b").inflight == 0
        p.rig.upstream.finish(answer)


async def test_a_first_copy_that_starts_within_the_tie_delay_goes_alone(rigs: Make) -> None:
    """An idle unit starts the request at once: a twin would start too and waste a prefill."""
    at_b: list[Peer] = []

    def start(peer: Peer, request: bytes) -> None:
        peer.write(HEAD + CHUNK)

    async with RawServer(start) as a, holding(at_b) as b:
        rig, seen = tied_rig(rigs, a.url, b.url, tie_delay=0.3)
        call = resumable(rig)
        with call.lease:
            unit, answer = await asyncio.wait_for(rig.dispatcher.open(call), 1.0)
            assert (unit.id, call.hedge) == ("a", "")
            assert TIED in a.peers[0].requests[0]  # marked: its head came at its start
            await asyncio.sleep(0.4)  # past the tie delay: still no twin
            assert not at_b and seen.named("hedged") == [] and seen.named("won") == []
            rig.upstream.finish(answer)


async def test_a_copy_that_started_then_stalls_is_hedged_after_the_delay(rigs: Make) -> None:
    """a starts the request at once (no twin), then no token comes: a stall after the start
    (a node lagging its gang), which the delayed hedge answers, as on any unit."""
    at_b: list[Peer] = []

    def start(peer: Peer, request: bytes) -> None:
        peer.write(HEAD)  # started, and stalls before its first token

    async with RawServer(start) as a, holding(at_b) as b:
        rig, seen = tied_rig(rigs, a.url, b.url, min_delay=0.3, max_delay=0.3)
        call = resumable(rig)
        with call.lease:
            loop = asyncio.get_running_loop()
            began = loop.time()
            task = asyncio.create_task(rig.dispatcher.open(call))
            await until(lambda: bool(at_b), 1.0, "the delayed hedge")
            assert loop.time() - began >= 0.25  # after the delay, not the tie delay
            assert TIED not in b.peers[0].requests[0]  # an ordinary second copy
            at_b[0].write(HEAD + CHUNK)
            unit, answer = await asyncio.wait_for(task, 1.0)
            assert (unit.id, call.hedge) == ("b", "second")
            assert [e[4] for e in seen.named("hedged")] == [""]
            await asyncio.wait_for(a.peers[0].closed.wait(), 1.0)
            rig.upstream.finish(answer)


async def test_a_unit_that_does_not_announce_its_starts_gets_the_delayed_hedge(
    rigs: Make,
) -> None:
    at_a: list[Peer] = []
    at_b: list[Peer] = []
    async with holding(at_a) as a, holding(at_b) as b:
        rig, seen = tied_rig(rigs, a.url, b.url, "b", min_delay=0.2, max_delay=0.3)
        call = resumable(rig)
        with call.lease:
            task = asyncio.create_task(rig.dispatcher.open(call))
            await until(lambda: bool(at_a), 0.5, "the first copy sent")
            await asyncio.sleep(0.1)
            assert not at_b, "the twin went at once to a unit that does not tie"
            assert TIED not in a.peers[0].requests[0]
            await until(lambda: bool(at_b), 1.0, "the delayed hedge")
            at_b[0].write(HEAD + CHUNK)
            unit, answer = await asyncio.wait_for(task, 1.0)
            assert (unit.id, call.hedge) == ("b", "second")
            assert [e[1:3] + e[4:] for e in seen.named("hedged")] == [("a", "b", "")]
            rig.upstream.finish(answer)


async def test_a_copy_refused_before_it_started_leaves_the_race_to_the_other(
    rigs: Make,
) -> None:
    """a answers 503 after the tie delay, its twin sent (a head, but not a start): b's copy
    runs on and is the answer. (A 503 within the tie delay is a failed attempt: retried.)"""
    at_b: list[Peer] = []

    def refuse(peer: Peer, request: bytes) -> None:
        busy = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy"
        asyncio.get_running_loop().call_later(0.15, peer.write, busy)

    async with RawServer(refuse) as a, holding(at_b) as b:
        rig, seen = tied_rig(rigs, a.url, b.url)
        call = resumable(rig)
        with call.lease:
            task = asyncio.create_task(rig.dispatcher.open(call))
            await until(lambda: bool(at_b), 0.5, "both copies sent")
            await asyncio.sleep(0.2)  # a's 503 is in
            assert not task.done()
            at_b[0].write(HEAD + CHUNK)
            unit, answer = await asyncio.wait_for(task, 1.0)
            assert (unit.id, answer.status, call.hedge) == ("b", 200, "tied second")
            assert rig.unit("a").inflight == 0
            assert seen.named("won") == [("won", "b", "a", True, 0)]
            rig.upstream.finish(answer)


async def test_starts_are_kept_in_order_and_only_a_200_head_is_a_start() -> None:
    starts = Starts()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    copies = (asyncio.ensure_future(never), asyncio.ensure_future(asyncio.sleep(10)))
    waiting = asyncio.ensure_future(starts.first(copies))  # type: ignore[arg-type]
    starts.hook(1)(503)  # a refusal's head
    await asyncio.sleep(0.01)
    assert not waiting.done()
    starts.hook(1)(200)
    starts.hook(0)(200)
    assert await asyncio.wait_for(waiting, 1.0) == 1
    assert starts.order == [1, 0]  # both started: the loser's prefill ran
    for task in copies:
        task.cancel()


# -- over two real builtin engines ---------------------------------------------------------

STEP_S = 0.02


@pytest.fixture
async def engines() -> AsyncIterator[list[tuple[LeaderEngine, str]]]:
    """Two tiny builtin engines with one KV slot each, their steps slowed to 20 ms."""
    async with tiny_leaders(2, slots=1, model=MODEL, step_s=STEP_S) as leaders:
        yield leaders


async def test_over_real_engines_the_idle_unit_wins_and_the_busy_one_never_starts(
    rigs: Make, engines: list[tuple[LeaderEngine, str]]
) -> None:
    (busy, a_url), (idle, b_url) = engines
    rig, seen = tied_rig(rigs, a_url, b_url)
    async with aiohttp.ClientSession() as client:
        for unit, url in (("a", a_url), ("b", b_url)):  # what each leader says of itself
            async with client.get(url + "/health") as resp:
                report = parse_health(resp.status, await resp.read(), 1.0)
            rig.unit(unit).tied = report.tied
        assert rig.unit("a").tied and rig.unit("b").tied
        hog = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hog"}],
            "stream": True,
            "max_tokens": 400,
            "ignore_eos": True,
        }
        held = await client.post(a_url + "/v1/chat/completions", json=hog)  # a's one slot
        await held.content.readany()
        queried = busy.health()["prefix_cache_queries"]
        call = resumable(rig)
        with call.lease:
            unit, answer = await asyncio.wait_for(rig.dispatcher.open(call), 5.0)
            assert (unit.id, answer.status, call.hedge) == ("b", 200, "tied second")
            assert seen.named("won") == [("won", "b", "a", True, 0)]
            rig.upstream.finish(answer)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while busy.health()["pending"] != 1:  # a's copy left its queue: aborted, never run
            assert loop.time() < deadline, "a's copy still waits in its queue"
            await asyncio.sleep(0.01)
        held.close()
        assert busy.health()["prefix_cache_queries"] == queried, "a prefilled its copy"
        assert idle.health()["prefix_cache_queries"] > 0

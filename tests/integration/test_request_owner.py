"""One owner per request, through a real gateway in front of the simulated units: whatever
ends a request (a refused body, an unknown model, a served answer or stream, a resumed
stream, a client that leaves, a 429, a 503, a 502), the observers hear `ended` exactly once,
with what the client got (`call.status`), who served it (`call.unit`) and what ended it
instead (`call.error`), and by then its admission slot is given back and its stream is no
longer live."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from gateway.outcomes import End
from gateway.proxy.call import Call
from gateway.server import Gateway, running
from gateway.signals import Observer
from tests.gateway.servers import until
from tests.support import (
    SimProcess,
    chat_body,
    gateway_config,
    session_ranking_first,
    sse_events,
)

pytestmark = pytest.mark.both_relays

CHAT = "/v1/chat/completions"


@dataclass
class Ending:
    call: Call
    # Admission slots held, the units' in-flight count and the live streams, as it ended.
    held: tuple[int, int, int]


class Owner(Observer):
    """Records every arrival and every end, and what was still held at each end."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.arrivals: list[str] = []
        self.endings: list[Ending] = []

    def received(self, call: Call) -> None:
        self.arrivals.append(call.rid)

    def ended(self, call: Call) -> None:
        self.endings.append(Ending(call, held(self.gw)))

    async def ending(self, rid: str, within: float = 5.0) -> Ending:
        """The one end of request `rid` (once it came)."""
        await until(lambda: any(e.call.rid == rid for e in self.endings), within, f"{rid} ended")
        mine = [e for e in self.endings if e.call.rid == rid]
        assert len(mine) == 1, mine
        assert self.arrivals.count(rid) == 1
        return mine[0]


def held(gw: Gateway) -> tuple[int, int, int]:
    return gw.admission.inflight, gw.units.total_inflight(), gw.live.count()


@dataclass
class Owned:
    gw: Gateway
    seen: Owner

    @property
    def url(self) -> str:
        return self.gw.public_url + CHAT

    async def settled(self) -> None:
        """Nothing held any more, and every request that arrived ended exactly once."""
        await until(lambda: held(self.gw) == (0, 0, 0), 5.0, f"released: {held(self.gw)}")
        assert sorted(e.call.rid for e in self.seen.endings) == sorted(self.seen.arrivals)


@pytest.fixture
async def owned(clean_sim: SimProcess) -> AsyncIterator[Owned]:
    config = gateway_config(
        clean_sim.units,
        # One request in flight through the gateway, none waiting: a second one is a 429.
        admission={"max_inflight": 1, "queue_size": 0},
        routing={"affinity": "session"},
        retry={"budget_min_per_second": 10.0},
        timeouts={"first_byte": 2.0, "idle": 2.0, "total": 10.0},
    )
    async with running(config) as gw:
        seen = Owner(gw)
        gw.signals.subscribe(seen)
        yield Owned(gw, seen)


def rid(name: str) -> dict[str, str]:
    return {"x-request-id": name}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"model": ', 400, None),
        (b'{"model": "no-such-model", "messages": [], "stream": true}', 404, "model_not_found"),
    ],
    ids=["bad_json", "unknown_model"],
)
async def test_a_refused_body_ends_once_with_its_4xx(
    owned: Owned, http: aiohttp.ClientSession, body: bytes, status: int, code: str | None
) -> None:
    headers = {**rid("bad"), "Content-Type": "application/json"}
    async with http.post(owned.url, data=body, headers=headers) as resp:
        assert resp.status == status
        if code is not None:
            assert (await resp.json())["error"]["code"] == code
    end = await owned.seen.ending("bad")
    assert (end.call.status, end.call.unit, end.call.error) == (status, None, None)
    assert end.call.attempts == 0 and end.held == (0, 0, 0)
    await owned.settled()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_served_answer_ends_once_with_its_unit(
    owned: Owned, http: aiohttp.ClientSession, stream: bool
) -> None:
    async with http.post(owned.url, json=chat_body(stream), headers=rid("ok")) as resp:
        assert resp.status == 200
        unit = resp.headers["x-unitgate-unit"]
        if stream:
            assert (await sse_events(resp))[-1] == "[DONE]"
        else:
            assert (await resp.json())["choices"]
    end = await owned.seen.ending("ok")
    assert end.call.unit is owned.gw.units.units[unit]
    assert (end.call.status, end.call.error, end.call.end) == (200, None, End.COMPLETE)
    assert end.call.attempts == 1 and end.held == (0, 0, 0)
    await owned.settled()


async def test_a_resumed_stream_ends_once_with_the_unit_that_finished_it(
    owned: Owned, clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    clean_sim.fault("u0", "drop", after_tokens=3)
    headers = {**rid("resumed"), "x-session-id": session_ranking_first("u0", ["u1", "u2"])}
    async with http.post(owned.url, json=chat_body(max_tokens=8), headers=headers) as resp:
        assert resp.status == 200 and resp.headers["x-unitgate-unit"] == "u0"
        events = await sse_events(resp)
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    end = await owned.seen.ending("resumed")  # two answers, one request: one end
    assert end.call.unit is not None and end.call.unit.id != "u0"
    assert [u.id for u in end.call.tried] == ["u0"]
    assert (end.call.status, end.call.error, end.call.end) == (200, None, End.COMPLETE)
    assert end.held == (0, 0, 0)
    await owned.settled()


async def test_a_client_leaving_mid_stream_ends_once_cancelled(
    owned: Owned, clean_sim: SimProcess
) -> None:
    for spec in clean_sim.units:
        clean_sim.post(f"/units/{spec['id']}/settings", {"itl_ms": 100, "tokens": 50})
    async with aiohttp.ClientSession() as client:
        resp = await client.post(owned.url, json=chat_body(), headers=rid("gone"))
        assert resp.status == 200
        unit = resp.headers["x-unitgate-unit"]
        await resp.content.readany()  # the stream is running
        assert held(owned.gw) == (1, 1, 1)
        assert resp.connection is not None and resp.connection.transport is not None
        resp.connection.transport.abort()  # the client vanishes
        resp.close()
    end = await owned.seen.ending("gone")
    assert isinstance(end.call.error, asyncio.CancelledError)
    assert end.call.unit is owned.gw.units.units[unit] and end.call.status == 200
    assert end.held == (0, 0, 0)
    await owned.settled()


async def test_a_429_while_the_one_slot_is_held_ends_once_without_a_unit(
    owned: Owned, clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    for unit in clean_sim.units:
        clean_sim.post(f"/units/{unit['id']}/settings", {"itl_ms": 20, "tokens": 20})
    async with http.post(owned.url, json=chat_body(), headers=rid("holder")) as holder:
        assert holder.status == 200
        await holder.content.readany()
        async with http.post(owned.url, json=chat_body(), headers=rid("refused")) as resp:
            assert resp.status == 429
            assert (await resp.json())["error"]["code"] == "saturated"
        end = await owned.seen.ending("refused")
        assert (end.call.status, end.call.unit, end.call.error) == (429, None, None)
        assert end.call.attempts == 0
        assert end.held == (1, 1, 1)  # the holder's, and nothing of its own
        assert (await sse_events(holder))[-1] == "[DONE]"
    end = await owned.seen.ending("holder")
    assert (end.call.status, end.call.error, end.call.end) == (200, None, End.COMPLETE)
    await owned.settled()


async def test_a_503_with_no_routable_unit_ends_once_without_a_unit(
    owned: Owned, http: aiohttp.ClientSession
) -> None:
    for unit_id in owned.gw.units.units:
        owned.gw.units.set_bit(unit_id, "enabled", False, "test")
    async with http.post(owned.url, json=chat_body(), headers=rid("none")) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "no_routable_unit"
    end = await owned.seen.ending("none")
    assert (end.call.status, end.call.unit, end.call.error) == (503, None, None)
    assert end.held == (0, 0, 0)
    await owned.settled()


async def test_every_attempt_failing_ends_once_with_a_502_and_no_unit(
    owned: Owned, clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    for unit in clean_sim.units:
        clean_sim.fault(unit["id"], "error", status=500)
    async with http.post(owned.url, json=chat_body(), headers=rid("failed")) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "status"
    end = await owned.seen.ending("failed")
    # No unit's answer reached the client: `unit` is None, though three units were tried.
    assert (end.call.status, end.call.unit, end.call.error) == (502, None, None)
    assert end.call.attempts == 3 and len({u.id for u in end.call.tried}) == 3
    assert end.held == (0, 0, 0)
    await owned.settled()

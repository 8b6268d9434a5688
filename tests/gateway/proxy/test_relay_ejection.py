"""The stream relay when its unit is ejected mid-answer (the harness of test_relay.py, in
tests/gateway/proxy/relay_support.py): a tracked (resumable) stream gone quiet for longer than its
pace allows breaks at once, one still receiving tokens goes on, and a plain stream, which could
not be resumed elsewhere, runs to its end."""

from __future__ import annotations

import asyncio

import pytest

from gateway.outcomes import End
from gateway.proxy.upstream import UpstreamClient
from tests.gateway.proxy.relay_support import (
    DONE,
    FIRST,
    LAST_CHUNK,
    OPENING,
    Relayed,
    chat_event,
    chunk,
    error_event,
    events,
    next_chunk,
    starts_with,
    stream_of,
    tracked,
)
from tests.gateway.servers import RawServer, until

pytestmark = pytest.mark.both_relays


async def test_an_ejected_units_quiet_stream_breaks_at_once(upstream: UpstreamClient) -> None:
    loop = asyncio.get_running_loop()
    async with RawServer(starts_with(OPENING)) as unit:
        relayed = Relayed(upstream, unit.url, idle=5.0, tracker=tracked(), quiet=(0.1, 4.0))
        async with stream_of(relayed) as resp:
            await next_chunk(resp)
            relay = relayed.relay
            assert relay is not None
            pace = relay.pace()
            assert pace is not None and pace[0] <= loop.time()
            # Quiet for longer than its pace allows (0.1 s at least), then its unit is ejected.
            await until(lambda: loop.time() - pace[0] > 0.15, 2.0, "quiet")
            ejected = loop.time()
            assert relay.on_unit_ejected("probe failed")
            assert await relayed.end() is End.UNIT_EJECTED
            assert loop.time() - ejected < 0.1  # at once, not at the idle time (5 s)
            ours, _ = events(await asyncio.wait_for(resp.read(), 2.0))
            assert error_event(ours)["code"] == "unit_ejected"
        assert relay.pace() is None  # no answer relayed now
        assert not relay.on_unit_ejected("again")  # between answers: nothing to break


@pytest.mark.parametrize("then", ["done", "quiet"])
async def test_an_ejected_units_stream_still_receiving_tokens_goes_on(
    upstream: UpstreamClient, then: str
) -> None:
    """Tokens 20 ms apart keep it going (its pace allows 1 s of quiet: room for a loaded test
    machine's stalls between them); if it then goes quiet it breaks by that pace, long before
    the idle time."""
    loop = asyncio.get_running_loop()
    async with RawServer(starts_with(OPENING)) as unit:
        relayed = Relayed(upstream, unit.url, idle=5.0, tracker=tracked(), quiet=(1.0, 4.0))
        async with stream_of(relayed) as resp:
            await next_chunk(resp)
            assert relayed.relay is not None
            for i in range(15):
                if i == 3:
                    assert relayed.relay.on_unit_ejected("probe failed")
                unit.peers[0].write(chunk(chat_event("x", [i])))
                await next_chunk(resp)
                await asyncio.sleep(0.02)
            assert not relayed.ended.done()
            if then == "done":
                unit.peers[0].write(chunk(chat_event("", [], "stop") + DONE) + LAST_CHUNK)
                assert await relayed.end() is End.COMPLETE
            else:
                last = loop.time()
                assert await relayed.end() is End.UNIT_EJECTED
                assert 0.9 <= loop.time() - last < 3.0


async def test_a_plain_stream_is_not_broken_by_an_ejection(upstream: UpstreamClient) -> None:
    """Without a tracker it cannot be resumed elsewhere: it runs to its end."""
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=5.0, quiet=(0.01, 1.0))
        async with stream_of(relayed) as resp:
            await next_chunk(resp)
            assert relayed.relay is not None
            assert not relayed.relay.on_unit_ejected("probe failed")
            unit.peers[0].write(chunk(DONE) + LAST_CHUNK)
            assert await next_chunk(resp) == DONE
            assert await relayed.end() is End.COMPLETE

"""The dispatcher with the units' caches known (their KV events): a request goes to the unit
holding its prompt, which may take more than the plain load bound the more of it it holds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence

import pytest

from gateway.routing.forecast import Forecast
from tests.gateway.proxy import dispatch_support
from tests.gateway.proxy.dispatch_support import HEAVY, Make, Rig, answering
from tests.gateway.servers import serve_app

rigs = dispatch_support.rigs
PROMPT = tuple(range(512))


def held_by_a(ids: Sequence[int], units: Iterable[str]) -> dict[str, int]:
    """Unit a's cache holds every prompt whole; the others nothing."""
    return {u: len(ids) for u in units if u == "a"}


async def placed(rig: Rig, n: int) -> list[str]:
    """Where each of `n` requests of one cached prompt goes, each held open: its unit's id
    and how it was chosen."""
    rig.dispatcher.depths = held_by_a
    found = []
    async with contextlib.AsyncExitStack() as held:
        for _ in range(n):
            call = rig.call()
            call.prompt_ids = PROMPT
            held.enter_context(call.lease)
            unit, answer = await rig.dispatcher.open(call)
            held.callback(rig.upstream.finish, answer)
            found.append(f"{unit.id}:{call.routed}")
    return found


@pytest.mark.parametrize("forecast", [None, Forecast()], ids=["no-forecast", "observed"])
async def test_a_holder_of_the_whole_prompt_takes_past_the_plain_bound(
    rigs: Make, forecast: Forecast | None
) -> None:
    """Over two units: at `cached_load_factor` (2x, the default) the holder of the whole
    prompt takes all four; at the plain bound (1.25x) a third in flight is past its bound
    (ceil(1.25 x 3 / 2) = 2), so that one is prefilled again on the other unit."""
    async with serve_app(answering([])) as a, serve_app(answering([])) as b:
        units = [("a", a, HEAVY), ("b", b, HEAVY)]
        assert await placed(rigs(units, forecast=forecast), 4) == ["a:cached"] * 4
        plain = rigs(units, forecast=forecast, routing={"cached_load_factor": 1.25})
        assert await placed(plain, 4) == ["a:cached", "a:cached", "b:load", "a:cached"]

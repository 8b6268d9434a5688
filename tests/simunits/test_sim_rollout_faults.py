"""What a rollout's SLO gates measure on simulated units: per-unit latency, failures at a rate."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from loadtest.simunits import Fault, FaultMode, Settings, SimCluster
from loadtest.simunits.cli import behaviour_settings, build_parser
from loadtest.simunits.client import ControlClient, ControlError, sse_data
from loadtest.simunits.state import ToolsMode, UnitState

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RATE_REQUESTS = 1000


def chat_url(cluster: SimCluster, index: int = 0) -> str:
    return cluster.units[index].leader_url + "/v1/chat/completions"


async def _time_to_first_event(session: aiohttp.ClientSession, url: str) -> float:
    start = time.monotonic()
    async with session.post(url, json={**CHAT, "stream": True, "max_tokens": 1}) as resp:
        first = await resp.content.readline()
        elapsed = time.monotonic() - start
        assert first.startswith(b"data: ")
        await resp.read()
    return elapsed


async def test_units_of_one_simulator_keep_their_own_ttft(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", ttft_ms=20)
    await control.settings("u1", ttft_ms=320)
    fast, slow = await asyncio.gather(
        _time_to_first_event(session, chat_url(cluster, 0)),
        _time_to_first_event(session, chat_url(cluster, 1)),
    )
    assert 0.02 <= fast < slow
    assert slow >= 0.32
    units = {u["id"]: u["settings"]["ttft_ms"] for u in await control.units()}
    assert units == {"u0": 20.0, "u1": 320.0}


async def test_stragglers_answer_their_first_token_late(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", ttft_ms=5, stall_rate=1.0, stall_ms=300)
    assert await _time_to_first_event(session, chat_url(cluster)) >= 0.3
    await control.settings("u0", stall_rate=0.0)
    assert await _time_to_first_event(session, chat_url(cluster)) < 0.25
    for bad in ({"stall_rate": 1.5}, {"stall_ms": -1}):
        with pytest.raises(ControlError) as info:
            await control.settings("u0", **bad)
        assert info.value.status == 400 and next(iter(bad)) in str(info.value.body)
    parser = build_parser()
    args = parser.parse_args(["--stall-rate", "0.02", "--stall-ms", "2000"])
    assert (behaviour_settings(args).stall_rate, behaviour_settings(args).stall_ms) == (0.02, 2000)


def _strikes(state: UnitState, fault: Fault, requests: int) -> list[int]:
    state.set_fault(fault)
    return [i for i in range(requests) if state.admit().mode is not FaultMode.NONE]


def test_rate_draws_from_the_seed() -> None:
    state = UnitState.new("u0", 1, Settings())
    seeded = Fault(FaultMode.DROP, rate=0.05, seed=7)
    first = _strikes(state, seeded, RATE_REQUESTS)
    assert 30 <= len(first) <= 70
    assert _strikes(state, seeded, RATE_REQUESTS) == first  # setting it again restarts it
    assert _strikes(state, Fault(FaultMode.DROP, rate=0.05, seed=8), RATE_REQUESTS) != first
    unseeded = Fault(FaultMode.DROP, rate=0.05)
    assert _strikes(state, unseeded, RATE_REQUESTS) != _strikes(state, unseeded, RATE_REQUESTS)
    assert state.fault == unseeded  # a fault at a rate lasts until cleared
    assert _strikes(state, Fault(FaultMode.ERROR, rate=1.0), 10) == list(range(10))


async def _statuses(session: aiohttp.ClientSession, url: str, requests: int) -> list[int]:
    statuses = []
    for _ in range(requests):
        async with session.post(url, json=CHAT) as resp:
            await resp.read()
            statuses.append(resp.status)
    return statuses


async def test_error_at_a_rate_strikes_its_share_reproducibly(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", ttft_ms=0, itl_ms=0, tokens=1)
    runs = []
    for _ in range(2):
        await control.fault("u0", "error", status=503, rate=0.05, seed=11)
        runs.append(await _statuses(session, chat_url(cluster), RATE_REQUESTS))
    first, second = runs
    struck = [i for i, status in enumerate(first) if status == 503]
    assert 0.03 * RATE_REQUESTS <= len(struck) <= 0.07 * RATE_REQUESTS
    assert set(first) == {200, 503}
    assert second == first
    stats = await control.stats("u0")
    assert (stats["failed"], stats["completed"]) == (
        2 * len(struck),
        2 * (RATE_REQUESTS - len(struck)),
    )
    fault = (await control.units())[0]["fault"]
    assert fault == {
        "mode": "error",
        "count": None,
        "status": 503,
        "after_tokens": 2,
        "rate": 0.05,
        "seed": 11,
    }


async def _stream_outcome(session: aiohttp.ClientSession, url: str) -> tuple[bool, list[bytes]]:
    """Whether the stream ended cleanly, and the events that arrived."""
    seen: list[bytes] = []
    try:
        async with session.post(url, json={**CHAT, "stream": True}) as resp:
            async for data in sse_data(resp):
                seen.append(data)
    except aiohttp.ClientError:
        return False, seen
    return True, seen


async def test_drop_at_a_rate_spares_the_others(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", ttft_ms=0, itl_ms=0, tokens=5)
    await control.fault("u0", "drop", after_tokens=3, rate=0.5, seed=3)
    outcomes = [await _stream_outcome(session, chat_url(cluster)) for _ in range(40)]
    dropped = [seen for ok, seen in outcomes if not ok]
    whole = [seen for ok, seen in outcomes if ok]
    assert dropped and whole
    for seen in dropped:
        assert len(seen) <= 4 and b"[DONE]" not in seen  # the role chunk and up to 3 tokens
    for seen in whole:
        texts = [orjson.loads(d)["choices"][0]["delta"].get("content") for d in seen[1:6]]
        assert texts == [f"tok{i} " for i in range(5)] and seen[-1] == b"[DONE]"
    stats = await control.wait_stats("u0", lambda s: s["in_flight"] == 0)
    assert (stats["failed"], stats["completed"]) == (len(dropped), len(whole))


@pytest.mark.parametrize(
    ("params", "field"),
    [({"tools": "maybe"}, "tools"), ({"tools": 1}, "tools"), ({"variant": 3}, "variant")],
)
async def test_bad_settings_are_rejected(
    control: ControlClient, params: dict[str, float | str], field: str
) -> None:
    with pytest.raises(ControlError) as info:
        await control.settings("u0", **params)
    body = info.value.body
    assert info.value.status == 400
    assert isinstance(body, dict) and body["field"] == field and field in body["error"]


async def test_settings_round_trip_and_reset(control: ControlClient) -> None:
    unit = await control.settings("u0", tools="bad_json", variant="r2")
    assert unit["settings"] == {
        "ttft_ms": 5.0,
        "itl_ms": 1.0,
        "tokens": 8,
        "tools": "bad_json",
        "variant": "r2",
        "stall_rate": 0.0,
        "stall_ms": 0.0,
    }
    await control.reset()
    settings = (await control.units())[0]["settings"]
    assert (settings["tools"], settings["variant"]) == ("call", "")


def test_cli_sets_tools_and_variant_for_every_unit() -> None:
    args = build_parser().parse_args(["--tools", "text", "--variant", "r2", "--ttft-ms", "7"])
    assert behaviour_settings(args) == Settings(7.0, 10.0, 16, ToolsMode.TEXT, "r2")
    assert behaviour_settings(build_parser().parse_args([])) == Settings()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--tools", "maybe"])

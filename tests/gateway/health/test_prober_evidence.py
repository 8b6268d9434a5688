"""What a node's answer to the prober makes of a round (the harness of test_prober.py, in
tests/gateway/health/prober_support.py): a refused node, a failing status or body, and a node
that is not the one configured are hard evidence against the unit; a silent one is soft
evidence, that makes the unit slow only while its traffic flows."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.health.kinds.unitgate import probe_node
from gateway.health.probe import Target
from gateway.health_states import Health, Outcome
from gateway.upstream.pool import ConnectionPool
from tests.gateway.health import prober_support
from tests.gateway.health.prober_support import Build, Node, served, timed_round
from tests.gateway.servers import RawServer, never, refused_url

# The shared fixture (prober_support.rigs), registered in this module: the dispatcher tests
# have a `rigs` of their own, so it cannot live in tests/gateway/conftest.py.
rigs = prober_support.rigs


async def test_a_refused_node_is_hard_evidence_against_the_unit(rigs: Build) -> None:
    async with served(Node(0)) as urls:
        with refused_url() as dead:
            rig = rigs([*urls, dead])
            result, _ = await timed_round(rig)
            assert result.outcome is Outcome.BAD and result.hard
            assert result.nodes == (None, "connection refused")
            assert result.problem == f"node 1 (follower {dead}): connection refused"
            assert rig.unit.health is Health.UNHEALTHY and rig.unit.hard
            assert not rig.unit.rescuable  # panic routing never brings it back
            leader, follower = rig.unit.nodes
            assert leader.healthy and not follower.healthy
            assert follower.error == "connection refused" and follower.latency_ms is None
            assert rig.counted("unitgate_probe_failures_total", rank="1") == 1
            assert rig.counted("unitgate_probe_failures_total", rank="0") == 0
            [event] = rig.events.recent()
            assert event.what == "unhealthy" and "connection refused" in event.reason

            # The same verdict again is not a new flip: one event, but every failure counted.
            again, _ = await timed_round(rig)
            assert again.flip is None and len(rig.events.recent()) == 1
            assert rig.counted("unitgate_probe_failures_total", rank="1") == 2
            assert rig.traffic_asked == []  # nothing soft to vouch for


async def test_every_failing_node_is_counted_the_leader_too(rigs: Build) -> None:
    """A refused leader beside a follower that answers: the leader's failure is counted, on
    rank 0, however its followers fare (each node's probe is its own sample)."""
    async with served(Node(1)) as urls:
        with refused_url() as dead:
            rig = rigs([dead, *urls])
            await timed_round(rig)
            assert rig.counted("unitgate_probe_failures_total", rank="0") == 1
            assert rig.counted("unitgate_probe_failures_total", rank="1") == 0


async def test_a_probe_that_times_out_is_soft_evidence() -> None:
    pool = ConnectionPool(1.0, 30.0, 0)
    try:
        async with RawServer(never) as silent:
            report = await probe_node(pool, Target(silent.url), 0.05)
            assert report.timed_out and report.latency_ms is None
            assert report.error == "no answer within 50 ms"
            await asyncio.wait_for(silent.peers[0].closed.wait(), 1.0)  # never reused
        with refused_url() as dead:
            refused = await probe_node(pool, Target(dead), 0.05)
            assert not refused.timed_out and refused.error == "connection refused"
    finally:
        pool.close()


@pytest.mark.parametrize("flowing", [False, True])
async def test_a_silent_node_makes_the_unit_slow_only_while_its_traffic_flows(
    rigs: Build, flowing: bool
) -> None:
    async with served(Node(0)) as urls, RawServer(never) as silent:
        rig = rigs([*urls, silent.url], flowing=flowing, timeout=0.05)
        result, took = await timed_round(rig)
        assert took < 0.05 + 0.5  # one probe timeout bounds the round
        assert not result.hard and result.nodes == (None, "no answer within 50 ms")
        [(unit_id, now, since)] = rig.traffic_asked
        assert unit_id == "u0"
        # The leader answered: only progress since the probes went out may vouch. `since` is
        # the round's start, a probe timeout before the verdict (uvloop's clock counts whole
        # milliseconds, so a few are allowed either way).
        assert since is not None and now - took - 0.005 <= since <= now - 0.04
        if flowing:
            assert result.outcome is Outcome.SLOW
            assert rig.unit.health is Health.SLOW and rig.unit.routable
        else:
            assert result.outcome is Outcome.BAD
            assert result.problem is not None
            assert result.problem.endswith("no live traffic on the unit to vouch for it")
            assert rig.unit.health is Health.UNHEALTHY and not rig.unit.hard
            assert rig.unit.rescuable  # soft: panic routing may still use it


async def test_a_silent_leader_is_vouched_for_by_its_traffic_window(rigs: Build) -> None:
    """A saturated leader answers /health late while it serves: its unit's recent traffic
    (the window, not only progress since the probe) may vouch for it."""
    async with served(Node(1)) as urls, RawServer(never) as silent:
        rig = rigs([silent.url, *urls], flowing=True, timeout=0.05)
        result, _ = await timed_round(rig)
        assert result.outcome is Outcome.SLOW
        [(_, _, since)] = rig.traffic_asked
        assert since is None


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (503, orjson.dumps({"status": "loading"}), "HTTP 503 (status loading)"),
        (500, b"Internal Server Error", "HTTP 500 without a JSON object body"),
        (200, b"ok", "HTTP 200 without a JSON object body"),
        (200, b"[1, 2]", "HTTP 200 without a JSON object body"),
    ],
)
async def test_a_bad_status_or_body_is_hard_evidence(
    rigs: Build, status: int, body: bytes, problem: str
) -> None:
    follower = Node(1)
    follower.status, follower.body = status, body
    async with served(Node(0), follower) as urls:
        rig = rigs(urls)
        result, _ = await timed_round(rig)
    assert result.outcome is Outcome.BAD and result.hard
    assert result.nodes == (None, problem)
    assert rig.unit.health is Health.UNHEALTHY and rig.unit.hard
    assert rig.unit.nodes[1].error == problem and rig.unit.nodes[1].latency_ms is not None


@pytest.mark.parametrize(
    ("rank", "change", "problem"),
    [
        (0, {"unit": "u9"}, "reports unit u9, expected u0"),
        (1, {"unit": None}, "reports unit None, expected u0"),
        (0, {"rank": 1}, "reports rank 1, expected 0"),
        (1, {"rank": True}, "reports rank None, expected 1"),  # a bool is not a rank
        (1, {"role": "leader"}, "reports role leader, expected follower"),
        (0, {"status": "draining"}, "status 'draining'"),
    ],
)
async def test_a_node_that_is_not_the_one_configured_is_hard_evidence(
    rigs: Build, rank: int, change: dict[str, Any], problem: str
) -> None:
    nodes = [Node(0), Node(1)]
    nodes[rank].doc.update(change)
    async with served(*nodes) as urls:
        rig = rigs(urls)
        result, _ = await timed_round(rig)
    expected: list[str | None] = [None, None]
    expected[rank] = problem
    assert result.nodes == tuple(expected)
    assert result.outcome is Outcome.BAD and result.hard
    assert rig.unit.health is Health.UNHEALTHY and rig.unit.hard

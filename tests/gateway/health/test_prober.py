"""The prober built on its own (no gateway): rounds over a unit's nodes on real `/health`
servers on 127.0.0.1 (tests/gateway/health/prober_support.py): a round probes every node at once and
records what each said, the canary, and the flip applied once. What a refused, silent, failing
or misidentified node makes of a round: test_prober_evidence.py; the prober's task and the
supervisor's: test_prober_lifecycle.py."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.health.verdict import Flip
from gateway.health_states import Health, Outcome
from gateway.units import UnitState
from tests.gateway.health import prober_support
from tests.gateway.health.prober_support import MODEL, Build, Node, served, timed_round

# The shared fixture (prober_support.rigs), registered in this module: the dispatcher tests
# have a `rigs` of their own, so it cannot live in tests/gateway/conftest.py.
rigs = prober_support.rigs


async def test_a_round_probes_every_node_at_once_and_records_what_each_said(
    rigs: Build,
) -> None:
    nodes = [Node(0), Node(1), Node(2)]
    arrived = asyncio.Event()

    async def all_three_in() -> None:  # sequential probes would never get past this
        if sum(len(n.peers) for n in nodes) == 3:
            arrived.set()
        await arrived.wait()

    for node in nodes:
        node.before = all_three_in
    async with served(*nodes) as urls:
        rig = rigs(urls)
        unit = rig.unit
        assert (unit.health, unit.routable) == (Health.UNKNOWN, False)
        result, _ = await timed_round(rig)
        assert result.outcome is Outcome.GOOD and result.nodes == (None, None, None)
        assert result.flip == Flip(Health.HEALTHY, "first probe round: all 3 nodes ok")
        assert rig.unit.health is Health.HEALTHY and rig.unit.routable
        assert rig.registry.routable(MODEL) == (rig.unit,)
        for rank, status in enumerate(rig.unit.nodes):
            assert status.healthy and status.error is None
            assert status.latency_ms is not None and status.latency_ms > 0
            assert (status.pid, status.step, status.pending) == (1000 + rank, 7, 0)
        [event] = rig.events.recent()
        assert (event.unit, event.what, event.who) == ("u0", "healthy", "prober")
        assert rig.counted("unitgate_health_transitions_total", to="healthy") == 1
        assert rig.traffic_asked == []  # asked only when a probe timed out

        for node in nodes:
            node.before = None
        second, _ = await timed_round(rig)
        assert second.outcome is Outcome.GOOD and second.flip is None
        assert len(rig.events.recent()) == 1  # steady state records nothing
        assert rig.prober.rounds == 2
        # Each node was probed once per round, the second time on the kept connection.
        for node in nodes:
            assert len(node.peers) == 2 and node.peers[0] == node.peers[1]


async def test_a_round_records_the_others_requests_the_leader_reports(rigs: Build) -> None:
    """The leader's queue and KV slots beyond this gateway's own requests are the others'."""
    leader = Node(0)
    leader.doc.update(pending=2, kv_slots_used=7)
    async with served(leader, Node(1)) as urls:
        rig = rigs(urls)
        rig.unit.inflight = 3
        await timed_round(rig)
        assert rig.unit.foreign == 6
        leader.doc.update(pending=0, kv_slots_used=1)
        await timed_round(rig)
        assert rig.unit.foreign == 0  # never below 0: the gateway counts its own first
        del leader.doc["pending"]
        rig.unit.foreign = 5
        await timed_round(rig)
        assert rig.unit.foreign == 0  # an engine that reports no load: own counts only


async def test_the_own_count_is_taken_when_the_leaders_count_arrives(rigs: Build) -> None:
    """A follower answering late holds the round open; our streams that end meanwhile must
    not pass for other replicas' (CI: a slow-probed unit then got no traffic for 2 s)."""
    leader, follower = Node(0), Node(1)
    leader.doc.update(pending=0, kv_slots_used=3)  # our 3 streams, as the leader counts them
    async with served(leader, follower) as urls:
        rig = rigs(urls)
        rig.unit.inflight = 3
        taken = asyncio.Event()

        def own(unit: UnitState) -> int:
            taken.set()
            return unit.inflight

        async def late() -> None:  # answers once the leader's count is in, our streams gone
            with contextlib.suppress(TimeoutError):  # (a prober that takes it late: 0.5 s)
                await asyncio.wait_for(taken.wait(), 0.5)
            rig.unit.inflight = 0

        rig.prober.own = own
        follower.before = late
        await timed_round(rig)
        assert rig.unit.foreign == 0  # taken at the round's end, 3 of ours would count as others'


async def test_the_canary_runs_every_kth_round_on_the_leader(rigs: Build) -> None:
    leader = Node(0)
    async with served(leader) as urls:
        rig = rigs(urls, canary_every=2, canary_timeout=1.0)
        first, _ = await timed_round(rig)
        assert first.outcome is Outcome.GOOD
        assert leader.completions == [
            ("unitgate-canary", {"model": MODEL, "prompt": "ping", "max_tokens": 1})
        ]
        await rig.prober.probe_round()  # round 1: no canary
        assert len(leader.completions) == 1
        leader.completion_status = 500
        failed, _ = await timed_round(rig)  # round 2: a canary that fails
        assert len(leader.completions) == 2
        assert failed.outcome is Outcome.BAD and failed.hard
        assert failed.nodes == (None,)  # /health itself was fine
        assert failed.problem is not None
        assert failed.problem.startswith("canary completion failed: HTTP 500")


async def test_an_idle_slow_unit_whose_follower_is_silent_is_asked_with_a_canary(
    rigs: Build,
) -> None:
    """A slow unit starved of streams by its slow weight cannot show progress: with nothing of
    ours in flight as the probes went out, a silent follower's round asks the leader for a
    token. An answer keeps the unit slow; a failed one ejects it at once, as hard evidence.
    With streams in flight, no canary: they are the evidence."""
    leader, follower = Node(0), Node(1)

    async def silent() -> None:
        await asyncio.sleep(0.5)

    follower.before = silent
    async with served(leader, follower) as urls:
        rig = rigs(urls, timeout=0.1, fall=2, canary_timeout=1.0)
        flows = [True, True]
        rig.prober.traffic = lambda unit, now, since=None: flows.pop(0) if flows else False
        rig.unit.inflight = 2
        for _ in range(2):  # traffic flows: slow, no canary
            assert (await rig.prober.probe_round()).outcome is Outcome.SLOW
        assert rig.unit.health is Health.SLOW and leader.completions == []
        rig.unit.inflight = 0  # a wave with none of its streams on the slow unit
        for n in (1, 2, 3):
            asked = await rig.prober.probe_round()
            assert asked.outcome is Outcome.SLOW and len(leader.completions) == n
        assert rig.unit.health is Health.SLOW
        assert asked.problem is not None and "no answer within 100 ms" in asked.problem
        rig.unit.inflight = 1  # a stream in flight that shows no progress: judged by it
        stalled = await rig.prober.probe_round()
        assert stalled.outcome is Outcome.BAD and len(leader.completions) == 3
        rig.unit.inflight = 0
        leader.completion_status = 500
        failed = await rig.prober.probe_round()
        assert failed.outcome is Outcome.BAD and failed.hard and len(leader.completions) == 4
        assert rig.unit.health is Health.UNHEALTHY
        rig.unit.inflight = 0
        follower.before = None  # not slow: no canary on an unhealthy unit either
        await rig.prober.probe_round()
        assert len(leader.completions) == 4


async def test_the_prober_learns_whether_the_leader_announces_its_starts(rigs: Build) -> None:
    """A builtin leader says `tied_requests` in its health: hedging may tie requests on it.
    What a leader that did not answer says nothing; one that answers without it does not tie."""
    leader = Node(0)
    async with served(leader) as urls:
        rig = rigs(urls, timeout=0.2)
        await rig.prober.probe_round()
        assert rig.unit.tied is False
        leader.doc["tied_requests"] = True
        await rig.prober.probe_round()
        assert rig.unit.tied is True
        leader.status = 503  # an error says nothing of what it can do
        await rig.prober.probe_round()
        assert rig.unit.tied is True
        leader.status = 200
        del leader.doc["tied_requests"]  # replaced by a server that does not announce
        await rig.prober.probe_round()
        assert rig.unit.tied is False


async def test_a_flip_for_a_unit_removed_meanwhile_is_not_applied(rigs: Build) -> None:
    async with served(Node(0)) as urls:
        rig = rigs(urls)
        rig.registry.remove("u0")
        result, _ = await timed_round(rig)
    assert result.flip is not None and result.flip.health is Health.HEALTHY
    assert rig.unit.health is Health.UNKNOWN  # nobody's business now
    assert rig.events.recent() == []
    assert rig.counted("unitgate_health_transitions_total", to="healthy") == 0

"""Gang health verdict on a fake clock: hysteresis, identity checks, stall detection, canary,
and the classes of evidence: hard, soft, soft with live traffic."""

from __future__ import annotations

import pytest

from gateway.config import HealthConfig
from gateway.health.kinds.unitgate import parse_health
from gateway.health.result import NodeReport
from gateway.health.verdict import GangVerdict, HealthMachine, StallWatch
from gateway.health_states import Health, Outcome

URLS = ("http://l:1", "http://f:2", "http://f:3")


def ok(rank: int, unit: str = "u3", step: int = 10, pending: int = 0) -> NodeReport:
    role = "leader" if rank == 0 else "follower"
    return NodeReport(1.0, None, "ok", unit, role, rank, 100 + rank, step, pending)


def good(step: int = 10, pending: int = 0) -> list[NodeReport]:
    return [ok(r, step=step, pending=pending) for r in range(len(URLS))]


TIMEOUT = NodeReport(None, "no answer within 200 ms", timed_out=True)
GOOD, SLOW, BAD = Outcome.GOOD, Outcome.SLOW, Outcome.BAD


def verdict(state: Health = Health.HEALTHY, fall: int = 2, rise: int = 2) -> GangVerdict:
    return GangVerdict("u3", URLS, fall=fall, rise=rise, stall_timeout=1.5, state=state)


def test_hysteresis_needs_consecutive_rounds() -> None:
    h = HealthMachine(fall=2, rise=3, state=Health.HEALTHY)
    assert [h.observe(x, True) for x in (BAD, GOOD, BAD)] == [False, False, False]
    assert h.observe(BAD, True) and h.state is Health.UNHEALTHY and h.hard
    assert [h.observe(x, True) for x in (GOOD, GOOD, BAD, GOOD, GOOD)] == [False] * 5
    assert h.observe(GOOD, False) and h.state is Health.HEALTHY and not h.hard


def test_an_unknown_unit_is_judged_by_its_first_round() -> None:
    up = HealthMachine(fall=2, rise=2)
    assert up.state is Health.UNKNOWN and not up.state.routable
    assert up.observe(GOOD, False) and up.state is Health.HEALTHY  # no `rise` rounds to wait
    down = HealthMachine(fall=2, rise=2)
    assert down.observe(BAD, True) and down.state is Health.UNHEALTHY  # judged: out, with why
    assert down.observe(BAD, False) and not down.hard  # the kind of evidence changed
    assert not down.observe(BAD, False)
    # Never routable yet: nothing to protect, so its first good round lets it in at once.
    assert down.observe(GOOD, False) and down.state is Health.HEALTHY
    # From then on hysteresis applies.
    assert not down.observe(BAD, True) and down.state is Health.HEALTHY


def test_slow_rounds_make_a_unit_slow_not_unhealthy() -> None:
    h = HealthMachine(fall=2, rise=2, state=Health.HEALTHY)
    assert not h.observe(SLOW, False)  # one slow round is a blip
    assert h.observe(SLOW, False) and h.state is Health.SLOW
    assert [h.observe(x, False) for x in (SLOW, GOOD, SLOW, BAD)] == [False] * 4
    assert h.observe(BAD, False) and h.state is Health.UNHEALTHY  # then nothing vouched for it
    assert not h.observe(SLOW, False)
    assert h.observe(SLOW, False) and h.state is Health.SLOW  # its traffic flows: back in
    assert not h.observe(GOOD, False)
    assert h.observe(GOOD, False) and h.state is Health.HEALTHY


def test_a_mix_of_slow_and_bad_rounds_ends_in_the_last_rounds_state() -> None:
    h = HealthMachine(fall=2, rise=2, state=Health.HEALTHY)
    assert not h.observe(BAD, True)
    assert h.observe(SLOW, False) and h.state is Health.SLOW
    h = HealthMachine(fall=2, rise=2, state=Health.HEALTHY)
    assert not h.observe(SLOW, False)
    assert h.observe(BAD, True) and h.state is Health.UNHEALTHY and h.hard


def test_a_probe_timeout_is_soft_and_live_traffic_vouches_for_the_unit() -> None:
    v = verdict(fall=1)
    slow = v.observe([ok(0), TIMEOUT, ok(2)], 0.0, flowing=True)
    assert slow.outcome is SLOW and not slow.hard
    assert slow.flip is not None and slow.flip.health is Health.SLOW and slow.flip.healthy
    assert slow.flip.reason == (
        "probes time out while its traffic flows: node 1 (follower http://f:2): no answer"
        " within 200 ms"
    )
    # The same timeouts with nothing flowing: out, on soft evidence (panic may still use it).
    dead = v.observe([ok(0), TIMEOUT, ok(2)], 0.25, flowing=False)
    assert dead.outcome is BAD and not dead.hard
    assert dead.flip is not None and dead.flip.health is Health.UNHEALTHY and not dead.flip.hard
    assert dead.flip.reason.endswith("; no live traffic on the unit to vouch for it")


def test_a_slow_unit_is_vouched_for_by_traffic_seen_within_its_grace() -> None:
    """Down-weighted, a slow unit's traffic comes in wider gaps: a gap within `slow_grace` of
    the last flowing round keeps it slow while its leader's probes time out; past it, or on
    hard evidence, it is out."""
    v = GangVerdict("u3", URLS, fall=2, rise=2, stall_timeout=1.5, slow_grace=3.0)
    timeouts = [TIMEOUT, ok(1), ok(2)]
    for now in (0.0, 0.25):
        v.observe(timeouts, now, flowing=True)
    assert v.health is Health.SLOW
    for now in (1.0, 2.0, 3.0):  # nothing flows now, but it did 3 s ago at most
        assert v.observe(timeouts, now, flowing=False).outcome is SLOW
    assert v.health is Health.SLOW
    assert v.observe(timeouts, 3.5, flowing=True).outcome is SLOW  # it flows again
    late = [v.observe(timeouts, now, flowing=False) for now in (6.75, 7.0)]  # 3.25 s, 3.5 s
    assert [r.outcome for r in late] == [BAD, BAD]
    assert late[-1].flip is not None and late[-1].flip.health is Health.UNHEALTHY
    assert late[-1].flip.reason.endswith("; no live traffic on the unit to vouch for it")
    # The grace is for a unit already slow: a healthy one with nothing flowing is judged bad.
    healthy = GangVerdict("u3", URLS, fall=2, rise=2, stall_timeout=1.5, slow_grace=3.0)
    healthy.observe(good(), 0.0)
    assert healthy.observe(timeouts, 0.5, flowing=False).outcome is BAD
    # Hard evidence on a slow unit within its grace: bad at once.
    v.observe(timeouts, 8.0, flowing=True)
    v.observe(timeouts, 8.25, flowing=True)
    refused = v.observe([ok(0), NodeReport(None, "connection refused"), ok(2)], 8.5)
    assert refused.outcome is BAD and refused.hard


def test_a_followers_timeouts_get_no_grace() -> None:
    """The leader answers, a follower does not: the caller asked for progress since the
    probes went out, and a round without it is bad, however recently the unit served (a
    follower frozen just after a token: the grace would keep its unit in until the stall
    rule, 2 s later)."""
    v = GangVerdict("u3", URLS, fall=2, rise=2, stall_timeout=1.5, slow_grace=3.0)
    timeouts = [ok(0), TIMEOUT, ok(2)]
    for now in (0.0, 0.25):
        assert v.observe(timeouts, now, flowing=True).outcome is SLOW
    assert v.health is Health.SLOW
    late = [v.observe(timeouts, now, flowing=False) for now in (0.5, 0.75)]
    assert [r.outcome for r in late] == [BAD, BAD]
    assert v.health is Health.UNHEALTHY and not v.machine.hard


def test_an_idle_slow_units_silent_follower_is_asked_and_an_answer_vouches() -> None:
    """A slow unit with nothing of ours in flight cannot show progress: the verdict asks for a
    canary before judging a follower's timeout, and its answer keeps the unit slow. Traffic,
    streams in flight, a leader's timeout (the grace's case) or hard evidence ask nothing."""
    v = verdict()
    silent = [ok(0), TIMEOUT, ok(2)]
    assert not v.wants_canary(silent, flowing=False, idle=True)  # healthy: judged as before
    for now in (0.0, 0.25):
        v.observe(silent, now, flowing=True)
    assert v.health is Health.SLOW
    assert v.wants_canary(silent, flowing=False, idle=True)
    assert not v.wants_canary(silent, flowing=True, idle=True)
    assert not v.wants_canary(silent, flowing=False, idle=False)
    assert not v.wants_canary([TIMEOUT, ok(1), ok(2)], flowing=False, idle=True)
    refused = [ok(0), TIMEOUT, NodeReport(None, "connection refused")]
    assert not v.wants_canary(refused, flowing=False, idle=True)
    for now in (0.5, 0.75, 1.0):
        assert v.observe(silent, now, asked=True).outcome is SLOW
    assert v.health is Health.SLOW
    assert [v.observe(silent, now).outcome for now in (1.25, 1.5)] == [BAD, BAD]
    assert v.health is Health.UNHEALTHY  # not asked, nothing flowing: out as before
    # A canary sent with the probes that answered vouches the same way, and says so.
    fresh = verdict()
    fresh.observe(good(), 0.0)
    flips = [fresh.observe(silent, now, asked=True).flip for now in (0.25, 0.5)]
    assert flips[-1] is not None and flips[-1].health is Health.SLOW
    assert flips[-1].reason.startswith("probes time out while a canary completion answered")


def test_the_slow_grace_scales_with_the_slow_units_share_of_traffic() -> None:
    assert HealthConfig().slow_grace() == pytest.approx(3.0)  # 1 s / 0.25 = 4 s in all
    assert HealthConfig(traffic_window=2.0, slow_weight=0.5).slow_grace() == pytest.approx(2.0)
    assert HealthConfig(slow_weight=1.0).slow_grace() == 0.0  # not down-weighted: no grace


@pytest.mark.parametrize(
    "report",
    [
        NodeReport(None, "connection refused"),
        NodeReport(None, "the node closed the connection"),
        NodeReport(1.0, "HTTP 503 (status unhealthy)", "unhealthy"),
        ok(1, unit="u7"),
    ],
)
def test_hard_evidence_ejects_whatever_the_traffic_says(report: NodeReport) -> None:
    v = verdict(fall=1)
    result = v.observe([ok(0), report, ok(2)], 0.0, flowing=True)
    assert result.outcome is BAD and result.hard
    assert result.flip is not None and result.flip.health is Health.UNHEALTHY and result.flip.hard


def test_a_timeout_beside_hard_evidence_is_hard() -> None:
    v = verdict(fall=1)
    result = v.observe([ok(0), TIMEOUT, NodeReport(None, "connection refused")], 0.0, True)
    assert result.outcome is BAD and result.hard


def test_a_stall_and_a_failed_canary_are_hard_even_with_traffic() -> None:
    v = verdict(fall=1)
    assert v.observe(good(), 0.0, canary="HTTP 500: boom", flowing=True).hard
    stalled = verdict(fall=1)
    stalled.observe(good(step=5, pending=2), 0.0)
    result = stalled.observe([ok(0, step=5, pending=2), TIMEOUT, ok(2)], 2.0, flowing=True)
    assert result.outcome is BAD and result.hard  # step frozen with work pending


def test_a_new_unit_is_routable_after_one_good_round() -> None:
    v = verdict(state=Health.UNKNOWN)
    flip = v.observe(good(), 0.0).flip
    assert flip is not None and flip.health is Health.HEALTHY
    assert flip.reason == "first probe round: all 3 nodes ok"


def test_a_dead_follower_marks_the_unit_down_after_fall_rounds() -> None:
    v = verdict()
    assert v.observe(good(), 0.0).flip is None
    dead = [*good()[:1], NodeReport(None, "connection refused"), ok(2)]
    first = v.observe(dead, 0.25)
    assert first.flip is None and first.nodes == (None, "connection refused", None)
    assert first.problem == "node 1 (follower http://f:2): connection refused"
    second = v.observe(dead, 0.5)
    assert second.flip is not None and not second.flip.healthy and second.flip.hard
    assert second.flip.reason == "node 1 (follower http://f:2): connection refused"
    assert v.observe(dead, 0.75).flip is None  # flipped once, not every round


def test_rise_good_rounds_bring_it_back_and_a_bad_one_restarts_the_count() -> None:
    v = verdict()
    bad = [ok(0), ok(1), NodeReport(None, "connection refused")]
    assert v.observe(bad, 0.0).flip is None
    assert v.observe(bad, 0.0).flip is not None
    assert v.observe(good(), 0.0).flip is None
    assert v.observe(bad, 0.25).flip is None
    assert v.observe(good(), 0.5).flip is None
    flip = v.observe(good(), 0.75).flip
    assert flip is not None and flip.healthy and flip.reason == "all 3 nodes ok for 2 rounds"


@pytest.mark.parametrize(
    ("report", "problem"),
    [
        (ok(1, unit="u7"), "reports unit u7, expected u3"),
        (ok(2), "reports rank 2, expected 1"),
        (NodeReport(1.0, None, "ok", "u3", "leader", 1), "reports role leader, expected follower"),
        (NodeReport(1.0, None, "degraded", "u3", "follower", 1), "status 'degraded'"),
        (
            NodeReport(1.0, "HTTP 503 (status unhealthy)", "unhealthy"),
            "HTTP 503 (status unhealthy)",
        ),
    ],
)
def test_each_node_problem_is_named(report: NodeReport, problem: str) -> None:
    v = verdict(fall=1)
    result = v.observe([ok(0), report, ok(2)], 0.0)
    assert result.nodes[1] == problem
    assert result.flip is not None
    assert result.flip.reason == f"node 1 (follower http://f:2): {problem}"


def test_the_leader_must_say_leader() -> None:
    v = verdict(fall=1)
    follower_at_rank0 = NodeReport(1.0, None, "ok", "u3", "follower", 0)
    result = v.observe([follower_at_rank0, ok(1), ok(2)], 0.0)
    assert result.problem == "node 0 (leader http://l:1): reports role follower, expected leader"


def test_several_failures_are_all_reported() -> None:
    v = verdict(fall=1)
    down = NodeReport(None, "connection refused")
    result = v.observe([ok(0), down, down], 0.0)
    assert result.problem == (
        "node 1 (follower http://f:2): connection refused; "
        "node 2 (follower http://f:3): connection refused"
    )


def test_stall_needs_pending_work_and_a_frozen_step() -> None:
    watch = StallWatch(1.5)
    assert watch.observe(812, 0, 0.0) is None
    assert watch.observe(812, 0, 5.0) is None  # idle: nothing to do is not a stall
    assert watch.observe(812, 3, 5.0) is None  # work arrived: the clock starts now
    assert watch.observe(812, 3, 6.5) is None  # exactly the timeout is still fine
    assert (
        watch.observe(812, 3, 6.6) == "engine stalled: step 812 unchanged for 1.6 s with 3 pending"
    )
    assert watch.observe(813, 3, 6.7) is None  # it moved again
    assert watch.observe(None, None, 99.0) is None  # no data: the node's failure speaks


def test_a_busy_engine_that_keeps_stepping_is_not_stalled() -> None:
    v = verdict(fall=1)
    for i in range(20):
        assert v.observe(good(step=i, pending=4), i * 0.25).problem is None


def test_a_stalled_engine_marks_the_unit_down() -> None:
    v = verdict()
    now, flips = 0.0, []
    while now < 3.0:
        result = v.observe(good(step=812, pending=3), now)
        if result.flip is not None:
            flips.append((now, result.flip))
        now += 0.25
    (at, flip), *rest = flips
    # Stalled from the round after 1.5 s (1.75), and down after a second bad round.
    assert not rest and not flip.healthy and at == 2.0
    assert flip.reason.startswith("engine stalled: step 812 unchanged for 2.0 s")
    assert flip.reason.endswith("with 3 pending")


def test_a_failed_canary_makes_the_round_bad() -> None:
    v = verdict(fall=1)
    result = v.observe(good(), 0.0, canary="HTTP 500: boom")
    assert result.nodes == (None, None, None)
    assert (
        result.flip is not None and result.flip.reason == "canary completion failed: HTTP 500: boom"
    )


def test_parse_health_answers() -> None:
    body = b'{"status":"ok","role":"leader","unit":"u3","rank":0,"pid":7,"step":5,"pending":1}'
    assert parse_health(200, body, 2.0) == NodeReport(2.0, None, "ok", "u3", "leader", 0, 7, 5, 1)
    down = parse_health(503, b'{"status":"unhealthy","rank":true}', 1.0)
    assert down.error == "HTTP 503 (status unhealthy)" and down.rank is None
    assert parse_health(200, b"<html>", 1.0).error == "HTTP 200 without a JSON object body"
    assert parse_health(502, b"[]", 1.0).error == "HTTP 502 without a JSON object body"


def test_parse_health_reads_the_kv_cache_share_from_the_leaders_slot_counts() -> None:
    body = b'{"status":"ok","rank":0,"step":5,"pending":0,"kv_slots_used":3,"kv_slots_total":12}'
    report = parse_health(200, body, 1.0)
    assert report.running == 3 and report.kv_usage == 0.25
    assert parse_health(200, b'{"status":"ok","kv_slots_used":3}', 1.0).kv_usage is None
    zero = b'{"status":"ok","kv_slots_used":3,"kv_slots_total":0}'
    assert parse_health(200, zero, 1.0).kv_usage is None


def test_parse_health_reads_the_progress_the_stall_rule_watches() -> None:
    body = b'{"status":"ok","rank":0,"step":5,"pending":1,"progress":120}'
    assert parse_health(200, body, 1.0).progress == 120
    assert parse_health(200, b'{"status":"ok","step":5}', 1.0).progress is None
    # A step slower than the stall timeout whose layers move is not a stall (the builtin
    # engine's `progress` counts layers run); a progress that stands still is one.
    v = verdict()
    for i in range(8):
        body = b'{"status":"ok","role":"leader","unit":"u3","rank":0,"pid":100,"step":5,'
        leader = parse_health(200, body + b'"pending":1,"progress":%d}' % (120 + i), 1.0)
        assert v.observe([leader, ok(1), ok(2)], 1.0 * i).problem is None
    assert v.observe([leader, ok(1), ok(2)], 10.0).problem == (
        "engine stalled: step 5 unchanged for 3.0 s with 1 pending"
    )


def test_a_unit_whose_latency_lags_the_fleet_is_slow_with_that_reason() -> None:
    v = verdict()
    lag = "its time to first token for 1,000 uncached prompt tokens ... is 3.1x the fleet's median"
    first = v.observe(good(), 1.0, lagging=lag)
    assert first.outcome is SLOW and first.problem == lag and first.flip is None  # a blip
    second = v.observe(good(), 2.0, lagging=lag)
    assert second.flip is not None and second.flip.health is Health.SLOW
    assert second.flip.reason == lag and v.health is Health.SLOW
    # A node's failure outranks it: a dead follower is bad, lagging or not.
    dead = [ok(0), NodeReport(None, "connection refused"), ok(2)]
    assert v.observe(dead, 3.0, lagging=lag).outcome is BAD
    # It catches up: healthy after `rise` good rounds.
    assert v.observe(good(), 4.0).flip is None
    back = v.observe(good(), 5.0).flip
    assert back is not None and back.health is Health.HEALTHY

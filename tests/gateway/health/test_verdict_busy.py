"""Busy is not dead, on a fake clock: a leader whose probes time out while its own engine report
(a stock vLLM's /metrics: `NodeReport.busy_at`) is fresh and shows work moving is slow, as one
whose traffic through the gateway flows; a report past its window, or one whose progress stood
still, vouches for nothing, and a frozen leader is ejected once its last report ages out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.config import UnitConfig
from gateway.health.kinds import report_window
from gateway.health.result import NodeReport
from gateway.health.verdict import GangVerdict, engine_working
from gateway.health_states import Health, Outcome

URL = "http://l:1"
WINDOW = 4.0  # 2 reads of the default load_interval (2 s)
INTERVAL = 0.25  # the default probe interval
TIMEOUT = NodeReport(None, "no answer within 200 ms", timed_out=True)
GOOD, SLOW, BAD = Outcome.GOOD, Outcome.SLOW, Outcome.BAD


def answered(
    step: int, pending: int = 3, busy_at: float | None = None, fresh: bool = True
) -> NodeReport:
    """The leader's /health answered 200, with its engine's last load (`fresh`: read now)."""
    return NodeReport(
        1.0,
        None,
        "ok",
        "v0",
        "leader",
        0,
        None,
        step,
        pending,
        pending,
        fresh=fresh,
        busy_at=busy_at,
    )


def late(busy_at: float | None) -> NodeReport:
    """The leader's /health timed out; the report carries its last engine report's witness."""
    return replace(TIMEOUT, busy_at=busy_at)


def verdict(*urls: str, slow_grace: float = 0.0, window: float = WINDOW) -> GangVerdict:
    return GangVerdict(
        "v0",
        urls or (URL,),
        fall=2,
        rise=2,
        stall_timeout=1.5,
        state=Health.HEALTHY,
        slow_grace=slow_grace,
        report_window=window,
    )


def test_a_fresh_report_of_work_moving_vouches_like_flowing_traffic() -> None:
    v = verdict()
    first = v.observe([late(busy_at=0.0)], 0.25)
    assert first.outcome is SLOW and not first.hard and first.flip is None
    second = v.observe([late(busy_at=0.0)], 0.5)
    assert second.flip is not None and second.flip.health is Health.SLOW and second.flip.healthy
    assert second.flip.reason == (
        f"probes time out while its engine reports work moving: node 0 (leader {URL}): no answer"
        " within 200 ms"
    )
    # It answers again: healthy after `rise` rounds, as from any slow spell.
    assert v.observe([answered(9)], 0.75).flip is None
    back = v.observe([answered(10)], 1.0).flip
    assert back is not None and back.health is Health.HEALTHY


def test_the_window_counts_from_the_read_not_from_the_round_that_carries_it() -> None:
    """A report read at 0 s is carried by every round after it: at 4 s it still vouches, a
    round later it does not, and `fall` such rounds eject the unit (soft: panic may use it)."""
    v = verdict()
    outcomes = [v.observe([late(busy_at=0.0)], t).outcome for t in (3.75, 4.0)]
    assert outcomes == [SLOW, SLOW] and v.health is Health.SLOW
    aged = [v.observe([late(busy_at=0.0)], t) for t in (4.25, 4.5)]
    assert [r.outcome for r in aged] == [BAD, BAD]
    flip = aged[-1].flip
    assert flip is not None and flip.health is Health.UNHEALTHY and not flip.hard
    assert flip.reason == (
        f"node 0 (leader {URL}): no answer within 200 ms; no live traffic on the unit, nor a"
        " fresh report of its engine working, to vouch for it"
    )


def test_progress_standing_still_or_no_work_vouches_for_nothing() -> None:
    """The probe gives `busy_at` None when its latest read showed no work, or progress equal
    to the read before: the unit is ejected after `fall` rounds, as a unit without a report."""
    v = verdict()
    assert [v.observe([late(busy_at=None)], t).outcome for t in (0.25, 0.5)] == [BAD, BAD]
    assert v.health is Health.UNHEALTHY and not v.machine.hard


def test_no_window_no_witness() -> None:
    """A kind that reports no engine work (window 0) is judged as before, whatever a report
    says; and the witness is weighed only with the window's bound, both ends included."""
    v = verdict(window=0.0)
    assert v.observe([late(busy_at=1.0)], 1.25).outcome is BAD
    report = late(busy_at=1.0)
    assert engine_working(report, 5.0, WINDOW) and not engine_working(report, 5.01, WINDOW)
    assert not engine_working(late(busy_at=None), 1.0, WINDOW)


def test_a_frozen_leader_is_ejected_once_its_last_report_ages_out() -> None:
    """A SIGSTOP on a leader busy with other clients' work: reads every 2 s showed progress
    moving, then /health times out for good and no read comes. Ejected at its last read + the
    window + `fall` rounds; a frozen leader whose engine was idle is ejected after `fall`
    rounds, as it always was."""

    def ejected_at(moving: bool) -> float:
        v = verdict()
        now, last_read, step = 0.0, 0.0, 0
        while now < 2.6:  # alive: a read every 8 rounds (2 s), the engine steps meanwhile
            read = round(now / INTERVAL) % 8 == 0
            if read:
                last_read, step = now, step + moving
            busy = last_read if moving and now >= 2.0 else None  # two reads to see it move
            report = answered(step, 3 if moving else 0, busy, fresh=read)
            assert v.observe([report], now).outcome is GOOD
            now += INTERVAL
        frozen_at = now
        while v.health.routable:
            v.observe([late(busy_at=last_read if moving else None)], now)
            now += INTERVAL
        return now - INTERVAL - frozen_at

    assert ejected_at(moving=False) == pytest.approx(INTERVAL)  # the second bad round
    # Last read at 2.0 s, frozen at 2.75 s: vouched for until 6.0 s, bad at 6.25 and 6.5.
    assert ejected_at(moving=True) == pytest.approx(6.5 - 2.75)


def test_the_engine_report_gets_no_slow_grace() -> None:
    """The grace makes up for the traffic a slow unit's down-weighting takes from it; the
    engine's work is not this gateway's to take, so a report past its window ends the
    vouching at once, though the unit went slow and traffic vouched for it before."""
    v = verdict(slow_grace=3.0)
    for t in (0.25, 0.5):
        v.observe([late(busy_at=0.0)], t)
    assert v.health is Health.SLOW
    assert v.observe([late(busy_at=0.0)], 4.25).outcome is BAD  # 4.25 s old, nothing flowed
    # Traffic seen flowing keeps its own grace beside it.
    v.observe([late(busy_at=0.0)], 4.5, flowing=True)
    assert v.observe([late(busy_at=0.0)], 7.0).outcome is SLOW  # 2.5 s after it flowed


def test_a_silent_follower_is_not_vouched_for_by_the_leaders_report() -> None:
    """Its leader answers: only progress since the probes went out vouches (the caller asks
    the traffic for it), and a report of work moving between two earlier reads is not that."""
    v = verdict(URL, "http://f:2")
    leader = answered(5, busy_at=0.2)
    rounds = [v.observe([leader, TIMEOUT], t).outcome for t in (0.25, 0.5)]
    assert rounds == [BAD, BAD] and v.health is Health.UNHEALTHY


def test_hard_evidence_ejects_whatever_the_engine_reports() -> None:
    v = verdict(URL, "http://f:2")
    refused = NodeReport(None, "connection refused")
    result = v.observe([late(busy_at=0.2), refused], 0.25)
    assert result.outcome is BAD and result.hard


def test_the_window_is_two_load_intervals_for_a_vllm_unit_and_none_for_the_others() -> None:
    vllm = UnitConfig(id="v", leader="http://h:1", kind="vllm", load_interval=0.5)
    assert report_window(vllm) == pytest.approx(1.0)
    assert report_window(UnitConfig(id="v", leader="http://h:1", kind="vllm")) == WINDOW
    for kind in ("unitgate", "openai"):
        assert report_window(UnitConfig(id="u", leader="http://h:1", kind=kind)) == 0.0

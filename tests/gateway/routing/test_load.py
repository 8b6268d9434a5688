"""The others' requests on a unit, from its leader's report and this gateway's own count."""

from __future__ import annotations

from gateway.routing.load import others


def test_the_leaders_count_beyond_the_own_is_the_others() -> None:
    assert others(pending=3, running=8, own=4) == 7
    assert others(pending=5, running=None, own=2) == 3  # an engine that reports a queue only


def test_never_negative_and_nothing_without_a_report() -> None:
    # The gateway counts a request before the leader has it, and after it has ended there.
    assert others(pending=0, running=2, own=5) == 0
    assert others(pending=None, running=4, own=0) == 0

"""Circuit breakers on a fake clock: plain floats, no sleeping, no jitter."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import BreakerConfig
from gateway.health.breaker import BreakerBoard, BreakerState, Transition

ADMITTING, EJECTED, PROBING = BreakerState.ADMITTING, BreakerState.EJECTED, BreakerState.PROBING


def make_board(*units: str, **settings: Any) -> BreakerBoard:
    """One unit by default, with the panic cap lifted (0.5 of one unit would refuse any trip)."""
    settings.setdefault("max_ejected_share", 1.0 if len(units) <= 1 else 0.5)
    board = BreakerBoard(BreakerConfig(**settings))
    for unit in units or ("a",):
        board.add(unit)
    return board


def feed(board: BreakerBoard, unit: str, ok: bool, n: int, now: float) -> list[Transition]:
    """Record `n` equal outcomes and return the transitions they caused."""
    results = [board.record(unit, ok, now) for _ in range(n)]
    return [t for t in results if t is not None]


def eject(board: BreakerBoard, unit: str, now: float) -> Transition:
    (transition,) = feed(board, unit, False, board.config.consecutive_failures, now)
    assert transition.new is EJECTED
    return transition


def recover(board: BreakerBoard, unit: str, now: float) -> None:
    """Ejected -> probing -> admitting at `now`, which must be past the ejection."""
    assert [t.new for t in board.tick(now) if t.unit == unit] == [PROBING]
    assert feed(board, unit, True, board.config.probe_requests, now)[-1].new is ADMITTING


def test_trips_on_consecutive_failures() -> None:
    board = make_board()
    assert feed(board, "a", False, 4, 100.0) == []
    assert board.state("a") is ADMITTING
    assert board.record("a", False, 100.5) == Transition(
        "a", ADMITTING, EJECTED, "5 consecutive failures", 100.5, until=101.5
    )
    assert board.state("a") is EJECTED


def test_a_success_resets_the_consecutive_count() -> None:
    board = make_board()
    feed(board, "a", False, 4, 0.0)
    board.record("a", True, 0.0)
    assert feed(board, "a", False, 4, 0.0) == []
    assert board.view("a", 0.0)["consecutive_failures"] == 4
    assert board.state("a") is ADMITTING


def test_failure_rate_trips_only_from_min_requests() -> None:
    board = make_board(consecutive_failures=100, min_requests=20, failure_rate=0.5)
    outcomes = [i % 2 == 1 for i in range(20)]  # fail, ok, fail, ...: 10 of 19 failed at #19
    transitions = [board.record("a", ok, 1.0) for ok in outcomes]
    assert transitions[:19] == [None] * 19
    assert transitions[19] == Transition(
        "a", ADMITTING, EJECTED, "failure rate 50% over 10 s (20 requests)", 1.0, until=2.0
    )


def test_failure_rate_below_threshold_does_not_trip() -> None:
    board = make_board(consecutive_failures=100, min_requests=20, failure_rate=0.5)
    for i in range(200):
        assert board.record("a", i % 3 != 0, i * 0.01) is None  # a third fail
    assert board.view("a", 2.0)["window_requests"] == 200


@pytest.mark.parametrize(("later", "counted"), [(5.0, 20), (10.5, 10), (30.0, 5)])
def test_window_forgets_old_outcomes(later: float, counted: int) -> None:
    """10 failures at 0 s, 5 at 4 s, 5 more `later`: only those within ~10 s count."""
    board = make_board(consecutive_failures=100, min_requests=20, window=10.0)
    assert feed(board, "a", False, 10, 0.0) == []
    assert feed(board, "a", False, 5, 4.0) == []
    tripped = feed(board, "a", False, 5, later)
    assert bool(tripped) is (counted >= 20)
    if not tripped:
        assert board.view("a", later)["window_requests"] == counted


def test_ok_outcomes_such_as_client_4xx_never_trip() -> None:
    board = make_board(min_requests=1)
    assert feed(board, "a", True, 1000, 0.0) == []
    assert board.view("a", 0.0)["window_failures"] == 0


def test_backoff_doubles_and_is_capped() -> None:
    board = make_board(base_ejection=1.0, max_ejection=5.0, probe_requests=1)
    now = 0.0
    until = eject(board, "a", now).until
    lengths = []
    for _ in range(5):
        assert until is not None
        lengths.append(until - now)
        now = until
        board.tick(now)
        failed = board.record("a", False, now)
        assert failed is not None
        assert (failed.old, failed.new, failed.reason) == (PROBING, EJECTED, "trial request failed")
        until = failed.until
    assert lengths == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_tick_moves_to_probing_only_when_due() -> None:
    board = make_board()
    eject(board, "a", 10.0)
    assert board.next_deadline() == 11.0
    assert board.tick(10.999) == []
    assert board.state("a") is EJECTED
    (moved,) = board.tick(11.0)
    assert (moved.unit, moved.old, moved.new, moved.at) == ("a", EJECTED, PROBING, 11.0)
    assert board.next_deadline() is None
    assert board.tick(20.0) == []


def test_probing_admits_after_enough_trial_successes() -> None:
    board = make_board(probe_requests=3)
    assert board.trial_cap("a") is None
    eject(board, "a", 0.0)
    assert board.trial_cap("a") is None
    board.tick(1.0)
    assert board.trial_cap("a") == 3
    assert feed(board, "a", True, 2, 1.5) == []
    assert board.state("a") is PROBING
    (back,) = feed(board, "a", True, 1, 1.5)
    assert (back.old, back.new, back.reason) == (PROBING, ADMITTING, "3 trial requests succeeded")
    assert board.trial_cap("a") is None
    view = board.view("a", 1.5)
    assert (view["consecutive_ejections"], view["window_requests"]) == (0, 0)
    assert eject(board, "a", 5.0).until == 6.0  # the backoff starts over


def test_a_trial_failure_ejects_again_for_twice_as_long() -> None:
    board = make_board(base_ejection=1.0)
    eject(board, "a", 0.0)
    board.tick(1.0)
    feed(board, "a", True, 2, 1.0)
    again = board.record("a", False, 1.2)
    assert again is not None
    assert (again.new, again.until) == (EJECTED, 3.2)
    assert board.view("a", 1.2)["consecutive_ejections"] == 2


def test_outcomes_while_ejected_are_ignored() -> None:
    board = make_board(probe_requests=3)
    eject(board, "a", 0.0)
    assert feed(board, "a", True, 10, 0.5) == []
    assert feed(board, "a", False, 10, 0.5) == []
    assert board.state("a") is EJECTED
    assert board.next_deadline() == 1.0  # failures did not extend the ejection
    board.tick(1.0)
    assert feed(board, "a", True, 2, 1.0) == []  # earlier successes were not trials
    assert board.state("a") is PROBING


def test_requests_started_before_the_ejection_are_not_trials() -> None:
    board = make_board(probe_requests=1)
    eject(board, "a", 5.0)
    board.tick(6.0)
    assert board.record("a", False, 7.0, started=4.0) is None
    assert board.record("a", True, 7.0, started=5.0) is None
    assert board.state("a") is PROBING
    back = board.record("a", True, 7.0, started=6.0)
    assert back is not None and back.new is ADMITTING


def test_panic_cap_suppresses_the_third_of_four_once_per_episode() -> None:
    board = make_board("a", "b", "c", "d", max_ejected_share=0.5)
    eject(board, "a", 0.0)
    eject(board, "b", 0.0)
    (refused,) = feed(board, "c", False, 5, 0.1)
    assert refused.suppressed and (refused.old, refused.new) == (ADMITTING, ADMITTING)
    assert refused.reason == (
        "trip suppressed by panic cap: 2 of 4 units ejected (5 consecutive failures)"
    )
    assert board.state("c") is ADMITTING
    assert board.view("c", 0.1)["consecutive_failures"] == 0  # counts start over
    assert feed(board, "c", False, 20, 0.2) == []  # same episode: reported once
    board.record("c", True, 0.3)
    (again,) = feed(board, "c", False, 5, 0.4)  # a success in between: a new episode
    assert again.suppressed
    recover(board, "a", 1.0)
    (tripped,) = feed(board, "c", False, 5, 1.1)
    assert (tripped.new, tripped.suppressed) == (EJECTED, False)


def test_panic_cap_reports_again_when_the_situation_changes() -> None:
    board = make_board("a", "b", "c", "d", "e", "f", max_ejected_share=0.5)
    for unit in ("a", "b", "c"):
        eject(board, unit, 0.0)
    assert feed(board, "d", False, 5, 0.0)[0].suppressed
    board.remove("f")  # 3 of 5 now: still refused, but worth saying so
    (again,) = feed(board, "d", False, 5, 0.0)
    assert "3 of 5 units ejected" in again.reason


def test_probing_units_count_as_ejected_for_the_cap() -> None:
    board = make_board("a", "b", "c", "d", max_ejected_share=0.5)
    eject(board, "a", 0.0)
    eject(board, "b", 0.0)
    board.tick(1.0)
    assert board.state("a") is PROBING
    assert feed(board, "c", False, 5, 1.0)[0].suppressed
    assert board.record("a", False, 1.0) is not None  # re-ejecting a probing unit is allowed
    assert board.state("a") is EJECTED


def test_a_lone_unit_is_never_ejected_under_a_cap_below_one() -> None:
    board = make_board("a", max_ejected_share=0.5)
    (refused,) = feed(board, "a", False, 5, 0.0)
    assert refused.suppressed and "0 of 1 units ejected" in refused.reason


def test_removed_units_are_forgotten() -> None:
    board = make_board("a", "b")
    eject(board, "a", 0.0)
    board.remove("a")
    board.remove("a")  # twice is harmless
    assert board.record("a", False, 0.5) is None
    assert board.tick(5.0) == []
    assert board.next_deadline() is None
    with pytest.raises(KeyError):
        board.state("a")
    board.add("a")
    assert board.state("a") is ADMITTING
    with pytest.raises(KeyError):
        board.add("a")


def test_disabled_board_never_trips() -> None:
    board = make_board(enabled=False, min_requests=1)
    assert feed(board, "a", False, 1000, 0.0) == []
    assert board.state("a") is ADMITTING
    assert board.tick(100.0) == []
    assert board.next_deadline() is None


def test_view_is_ready_for_the_admin_api() -> None:
    board = make_board()
    feed(board, "a", False, 2, 0.0)
    eject(board, "a", 1.0)
    assert board.view("a", 1.25) == {
        "state": "ejected",
        "reason": "5 consecutive failures",
        "ejected_until": 2.0,
        "ejection_left": 0.75,
        "consecutive_ejections": 1,
        "consecutive_failures": 0,
        "window_requests": 0,
        "window_failures": 0,
        "trial_successes": None,
    }

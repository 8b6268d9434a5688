"""The order of one unit's event batches: applied, skipped, a gap, a restarted engine."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.kvevents.order import Order, Step


def test_batches_in_order_are_applied_from_zero() -> None:
    order = Order()
    assert order.want == 0
    for seq in range(3):
        assert order.live(seq) is Step.APPLY
        order.applied(seq)
    assert order.last == 2 and order.want == 3


def test_a_first_batch_past_zero_is_a_gap_to_replay_from_zero() -> None:
    order = Order()
    assert order.live(5) is Step.GAP
    assert order.want == 0


def test_a_skipped_number_is_a_gap_from_the_first_missed() -> None:
    order = Order()
    order.applied(0)
    assert order.live(3) is Step.GAP
    assert order.want == 1
    assert order.replayed(0) is Step.SKIP
    assert order.replayed(1) is Step.APPLY
    order.applied(1)
    assert order.replayed(2) is Step.APPLY
    order.applied(2)
    order.replay_done()
    assert order.live(3) is Step.APPLY


def test_a_replay_that_starts_past_what_is_missing_is_a_gap() -> None:
    order = Order()
    order.applied(0)
    assert order.replayed(4) is Step.GAP  # batches 1..3 are no longer kept


def test_live_batches_a_replay_already_gave_are_skipped_then_the_stream_goes_on() -> None:
    order = Order()
    for seq in range(6):  # a replay from 0 gave 0..5
        order.applied(seq)
    order.replay_done()
    for seq in (3, 4, 5):  # the same batches, queued on the live socket meanwhile
        assert order.live(seq) is Step.SKIP
    assert order.live(6) is Step.APPLY
    order.applied(6)
    # past the overlap, a lower number is an engine that started again
    assert order.live(2) is Step.RESTART


def test_a_lower_number_without_a_replay_is_a_restarted_engine() -> None:
    order = Order()
    for seq in range(10):
        order.applied(seq)
    assert order.live(0) is Step.RESTART
    assert order.live(10) is Step.APPLY
    order.restart()
    assert order.last is None and order.live(0) is Step.APPLY


def test_resuming_after_an_unfilled_gap_applies_the_batch_that_showed_it() -> None:
    order = Order()
    order.applied(0)
    assert order.live(40) is Step.GAP
    order.resume_at(40)
    assert order.live(40) is Step.APPLY


@given(st.lists(st.integers(0, 30), max_size=60))
def test_without_a_replay_each_verdict_follows_from_the_number(seqs: list[int]) -> None:
    """Live batches alone (no replay, so no overlap): the next number is applied, a higher one
    is a gap, a lower or repeated one a restart; nothing is ever skipped."""
    order = Order()
    for seq in seqs:
        want, last = order.want, order.last
        step = order.live(seq)
        if step is Step.APPLY:
            assert seq == want
            order.applied(seq)
        elif step is Step.GAP:
            assert seq > want
            order.resume_at(seq)
        else:
            assert step is Step.RESTART and last is not None and seq <= last
            order.restart()

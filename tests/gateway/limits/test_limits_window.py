"""The sliding window's arithmetic (gateway/limits/window.py), the lease size and the headers'
formats: pure functions, on made-up times."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.limits import window
from gateway.limits.headers import duration, rate_headers, retry_after
from gateway.limits.lease import Slots, lease_extra

T0 = 1_000_000.0


def test_a_bucket_counts_for_the_closed_span_of_60_s_after_any_admission_in_it() -> None:
    counts = {window.bucket_of(T0 + 0.9): 1}
    assert window.used(counts, window.bucket_of(T0 + 0.9 + 60)) == 1  # exactly 60 s later
    assert window.used(counts, window.bucket_of(T0 + 60.999)) == 1
    assert window.used(counts, window.bucket_of(T0 + 61.0)) == 0  # leaves_at: bucket + 61
    assert window.leaves_at(window.bucket_of(T0)) == T0 + 61


def test_frees_at_is_when_the_oldest_buckets_have_left_enough_room() -> None:
    counts = {int(T0): 3, int(T0) + 5: 4, int(T0) + 9: 2}
    now = T0 + 20
    assert window.frees_at(counts, 10, 1, now) == now  # 9 used, 1 fits
    assert window.frees_at(counts, 10, 2, now) == T0 + 61  # the first bucket leaving frees 3
    assert window.frees_at(counts, 10, 5, now) == T0 + 66
    assert window.frees_at(counts, 10, 10, now) == T0 + 70
    assert window.frees_at(counts, 10, 11, now) == window.NEVER
    assert window.empty_at(counts, now) == T0 + 70
    assert window.empty_at({}, now) == now


def test_add_prunes_and_a_refund_never_goes_below_zero() -> None:
    counts: dict[int, int] = {int(T0): 5}
    window.add(counts, int(T0), -8, int(T0) + 1)
    assert counts == {}
    counts = {int(T0): 5, int(T0) + 30: 1}
    window.add(counts, int(T0), 2, int(T0) + 61)  # the bucket left: nothing happens to it
    assert counts[int(T0)] == 5 and window.used(counts, int(T0) + 61) == 1
    window.add(counts, int(T0) + 61, 1, int(T0) + 61)  # a new bucket: the old ones go
    assert counts == {int(T0) + 30: 1, int(T0) + 61: 1}


@given(
    st.lists(st.floats(min_value=0, max_value=300, allow_nan=False), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=20),
)
def test_admitting_by_the_window_never_puts_more_than_the_limit_in_any_60_s(
    times: list[float], limit: int
) -> None:
    counts: dict[int, int] = {}
    admitted: list[float] = []
    for t in sorted(T0 + x for x in times):
        now_bucket = window.bucket_of(t)
        if window.used(counts, now_bucket) + 1 <= limit:
            window.add(counts, now_bucket, 1, now_bucket)
            admitted.append(t)
        else:  # refused: the limit is really spent in the last 61 s (conservative by < 1 s)
            assert sum(1 for s in admitted if t - 61 < s <= t) >= limit
    for start in admitted:  # every closed span [start, start + 60]
        assert sum(1 for s in admitted if start <= s <= start + 60) <= limit


def test_lease_extra_shrinks_to_zero_near_the_limit() -> None:
    assert lease_extra(1000, 100, 0.5 / 3) == 100
    assert lease_extra(119, 100, 0.5 / 3) == 19
    assert lease_extra(5, 100, 0.5 / 3) == 0
    assert lease_extra(0, 100, 0.5) == 0
    assert lease_extra(-3, 100, 0.5) == 0


def test_slots_keep_what_churned_and_shed_what_stayed_idle() -> None:
    slots = Slots(held=4)
    assert slots.shed() == 0  # slots just taken are kept for one interval
    assert slots.acquire() and slots.acquire()
    slots.release()
    assert slots.shed() == 2  # 2 stayed idle the whole interval: returned
    assert (slots.held, slots.used) == (2, 1)
    assert slots.shed() == 1
    assert (slots.held, slots.used) == (1, 1)
    assert not slots.acquire()


def test_durations_are_written_the_way_openai_writes_them() -> None:
    assert duration(0.02) == "20ms"
    assert duration(0.0201) == "21ms"  # rounded up: never earlier than the window frees
    assert duration(0) == "0s"
    assert duration(-1) == "0s"
    assert duration(1) == "1s"
    assert duration(1.5) == "2s"
    assert duration(360) == "6m0s"
    assert duration(3723) == "1h2m3s"
    assert duration(90_000) == "25h0m0s"
    assert retry_after(0.2) == 1
    assert retry_after(1.0) == 1
    assert retry_after(1.01) == 2


def test_rate_headers_name_only_the_limits_that_are_set() -> None:
    assert rate_headers((120, 7, 2.0), None) == {
        "x-ratelimit-limit-requests": "120",
        "x-ratelimit-remaining-requests": "7",
        "x-ratelimit-reset-requests": "2s",
    }
    assert rate_headers(None, (1000, -5, 0.5))["x-ratelimit-remaining-tokens"] == "0"

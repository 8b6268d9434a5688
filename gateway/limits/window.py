"""A sliding window of one minute, kept as counts in 1 s buckets.

An admission at time t goes into bucket floor(t). A check at time t counts the buckets
floor(t) - 60 .. floor(t), 61 of them: any admission at s with t - 60 <= s <= t has
floor(s) >= floor(t) - 60, so every admission of the closed span [t - 60, t] is counted and no
60 s span ever holds more than the limit. The price is that an admission may count for up to
61 s (a bucket b stops counting at b + 61). The same arithmetic runs in Python (the in-memory
store and each process's own ledger) and in the Redis store's Lua (redis_store.py), which
mirrors `used`, `frees_at` and `empty_at` line for line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

SPAN_S = 60  # the window: at most `limit` admissions in any span of this many seconds
BUCKETS = SPAN_S + 1  # counted at once (the current bucket and the 60 before it)
NEVER = math.inf  # `frees_at` of a need larger than the limit


def bucket_of(now: float) -> int:
    return math.floor(now)


def counted(bucket: int, now_bucket: int) -> bool:
    """Whether an admission in `bucket` still counts at a time in `now_bucket`."""
    return now_bucket - SPAN_S <= bucket <= now_bucket


def leaves_at(bucket: int) -> int:
    """The first moment `bucket` no longer counts."""
    return bucket + BUCKETS


def used(counts: Mapping[int, int], now_bucket: int) -> int:
    return sum(c for b, c in counts.items() if counted(b, now_bucket))


def frees_at(counts: Mapping[int, int], limit: int, need: int, now: float) -> float:
    """The earliest time from `now` at which `need` more fits under `limit` (NEVER if it
    cannot: need > limit). Buckets leave oldest first, each at `leaves_at`."""
    now_bucket = bucket_of(now)
    total = used(counts, now_bucket)
    if total + need <= limit:
        return now
    if need > limit:
        return NEVER
    for bucket in sorted(b for b in counts if counted(b, now_bucket)):
        total -= counts[bucket]
        if total + need <= limit:
            return float(leaves_at(bucket))
    return NEVER  # unreachable: once every bucket left, total is 0 and need <= limit


def empty_at(counts: Mapping[int, int], now: float) -> float:
    """When the window holds nothing any more (OpenAI's reset "to its initial state")."""
    now_bucket = bucket_of(now)
    live = [b for b, c in counts.items() if c > 0 and counted(b, now_bucket)]
    return float(leaves_at(max(live))) if live else now


def add(counts: dict[int, int], bucket: int, delta: int, now_bucket: int) -> None:
    """Add `delta` (a refund when negative, never below 0) to `bucket`; the buckets that no
    longer count are dropped whenever a new one starts. A bucket that already left the window
    is not touched."""
    if bucket not in counts:
        for old in [b for b in counts if b < now_bucket - SPAN_S]:
            del counts[old]
    if not counted(bucket, now_bucket) and bucket <= now_bucket:
        return
    value = counts.get(bucket, 0) + delta
    if value > 0:
        counts[bucket] = value
    else:
        counts.pop(bucket, None)

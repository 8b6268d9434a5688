"""Per-second time series of a run, and how long the load took to recover after an action.

A run's summary averages a fault away; one-second buckets show when errors started and
stopped. Every count is bucketed by a single instant (start, end, first token), so each
column sums to the run's total and the series can be checked against the summary.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loadtest.gen.client import RequestRecord
from loadtest.gen.stats import percentile

BUCKET_S = 1.0


@dataclass(slots=True)
class _Bucket:
    started: int = 0
    completed: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    tokens: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    e2es: list[float] = field(default_factory=list)


def _index(t: float) -> int:
    return max(0, math.floor(t / BUCKET_S))


def timeseries(
    records: Sequence[RequestRecord], ends: Mapping[int, float], wall_s: float
) -> dict[str, object]:
    """`ends` maps a request's index to when it ended (seconds from the run start).

    Output tokens of a successful request are spread evenly over its streamed chunks, so
    they land in the seconds they arrived in and still add up to the summary's count.
    Requests cut at the end of the grace are left out, as they are of the summary's counts.
    """
    records = [r for r in records if r.ended != "cut"]
    last = max([wall_s, *ends.values(), *(r.scheduled for r in records)], default=0.0)
    buckets = [_Bucket() for _ in range(_index(last) + 1 if records else math.ceil(wall_s))]
    for r in records:
        _add(buckets, r, ends.get(r.index, r.scheduled + (r.e2e or 0.0)))
    return {"bucket_s": BUCKET_S, "buckets": [_bucket_json(i, b) for i, b in enumerate(buckets)]}


def _add(buckets: list[_Bucket], r: RequestRecord, end: float) -> None:
    buckets[_index(r.scheduled)].started += 1
    done = buckets[_index(end)]
    if not r.ok:
        done.failed += 1
        done.errors[r.error or "unknown"] += 1
        return
    done.completed += 1
    if r.e2e is not None:
        done.e2es.append(r.e2e)
    if r.ttft is not None:
        buckets[_index(r.scheduled + r.ttft)].ttfts.append(r.ttft)
    if r.token_times:
        share = r.output_tokens / len(r.token_times)
        for t in r.token_times:
            buckets[_index(t)].tokens += share


def _ms(samples: list[float], q: float) -> float | None:
    return round(percentile(sorted(samples), q) * 1000, 3) if samples else None


def _bucket_json(i: int, b: _Bucket) -> dict[str, object]:
    return {
        "t_s": i * BUCKET_S,
        "started": b.started,
        "completed": b.completed,
        "failed": b.failed,
        "errors": dict(sorted(b.errors.items())),
        "output_tokens": round(b.tokens, 3),  # per second, as buckets are 1 s wide
        "ttft_p50_ms": _ms(b.ttfts, 50),
        "ttft_p99_ms": _ms(b.ttfts, 99),
        "e2e_p50_ms": _ms(b.e2es, 50),
    }


def failover(buckets: Sequence[Mapping[str, object]], at_s: float) -> tuple[float | None, int]:
    """Seconds from an action until the load is clean again, and the failures in between.

    Clean means a bucket with no failures and at least one completion. Buckets from the one
    holding the action count; a clean bucket before the first failure does not end the
    failover, because a fault's errors often surface late (a killed unit shows up as
    timeouts). No failure after the action means 0 s. `None` means it never recovered.
    Failures counted include those of the action's own bucket from before the action.
    """
    first = _index(at_s)
    failed = [_int(b, "failed") for b in buckets]
    failing = next((i for i in range(first, len(buckets)) if failed[i] > 0), None)
    if failing is None:
        return 0.0, 0
    for i in range(failing + 1, len(buckets)):
        if failed[i] == 0 and _int(buckets[i], "completed") > 0:
            return round(max(0.0, i * BUCKET_S - at_s), 3), sum(failed[first:i])
    return None, sum(failed[first:])


def _int(bucket: Mapping[str, object], key: str) -> int:
    value = bucket.get(key, 0)
    return value if isinstance(value, int) else 0

"""Aggregation of per-request records into the numbers a run is judged by.

Percentiles come from the exact sorted samples (nearest rank), not from histograms, so a
p99 over a few hundred requests is a real observed latency and runs can be compared exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.gen.client import RequestRecord


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted samples; q in [0, 100]."""
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def distribution(samples_s: Sequence[float]) -> dict[str, float | int | None]:
    """Summary of latencies given in seconds, reported in milliseconds."""
    return summarize([s * 1000 for s in samples_s])


def summarize(samples: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, p50, p90, p99 and max in the samples' own unit; None when empty."""
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(ordered),
        "mean": sum(ordered) / len(ordered),
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "max": ordered[-1],
    }


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    """A request counts for goodput only if it succeeded and met every SLO it was given; a
    non-streamed answer has no TTFT, so it cannot meet a TTFT limit."""
    if not record.ok:
        return False
    if slo.ttft_ms is not None and (record.ttft is None or record.ttft * 1000 > slo.ttft_ms):
        return False
    tpot = record.tpot
    return slo.tpot_ms is None or tpot is None or tpot * 1000 <= slo.tpot_ms


def aggregate(records: Sequence[RequestRecord], wall_s: float, slo: Slo) -> dict[str, object]:
    """Figures over the requests that ended, those that ended in the grace after the
    duration included (whole answers: leaving them out would drop the slowest). Requests cut
    at the end of the grace are only counted, as `cut`: they neither succeeded nor failed."""
    ended = [r for r in records if r.ended != "cut"]
    ok = [r for r in ended if r.ok]
    wall = max(wall_s, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    good = sum(1 for r in ended if meets_slo(r, slo))
    return {
        "requests": len(ended),
        "succeeded": len(ok),
        "failed": len(ended) - len(ok),
        "ended_in_grace": sum(1 for r in ended if r.ended == "grace"),
        "cut": len(records) - len(ended),
        "wall_s": wall_s,
        "request_throughput_rps": len(ok) / wall,
        "output_token_throughput_tps": out_tokens / wall,
        "output_tokens": out_tokens,
        "errors": dict(sorted(Counter(r.error for r in ended if r.error).items())),
        "ttft_ms": distribution([r.ttft for r in ok if r.ttft is not None]),
        "itl_ms": distribution([gap for r in ok for gap in r.itls]),
        "tpot_ms": distribution([t for r in ok if (t := r.tpot) is not None]),
        "e2e_ms": distribution([r.e2e for r in ok if r.e2e is not None]),
        "goodput": {
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
            "requests": good,
            "rps": good / wall,
            "fraction": good / len(ended) if ended else None,
        },
        "lengths": lengths(records),
        "output_tokens_from": dict(
            sorted(Counter(r.tokens_from for r in ok if r.tokens_from).items())
        ),
    }


def lengths(records: Sequence[RequestRecord]) -> dict[str, dict[str, float | int | None]]:
    """Asked-for lengths over every request sent; realised ones (from the server's usage)
    over the successful ones, so a server that cuts answers short or tokenizes the padded
    words differently than expected shows as a gap between the pairs."""
    ok = [r for r in records if r.ok]
    return {
        "input_words": summarize([r.input_words for r in records if r.input_words is not None]),
        "input_tokens": summarize([r.input_tokens for r in records if r.input_tokens is not None]),
        "prompt_tokens": summarize([r.prompt_tokens for r in ok if r.prompt_tokens is not None]),
        "max_tokens": summarize([r.max_tokens for r in records if r.max_tokens is not None]),
        "output_tokens": summarize([r.output_tokens for r in ok]),
    }


def record_json(record: RequestRecord) -> dict[str, object]:
    """One request as written to result.json; times in milliseconds from the run start."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 3)

    itls = record.itls
    return {
        "index": record.index,
        "scheduled_ms": ms(record.scheduled),
        "session_id": record.session_id,
        "input_words": record.input_words,
        "max_tokens": record.max_tokens,
        "status": record.status,
        "error": record.error,
        "ttft_ms": ms(record.ttft),
        "e2e_ms": ms(record.e2e),
        "tpot_ms": ms(record.tpot),
        "itl_mean_ms": ms(sum(itls) / len(itls)) if itls else None,
        "output_tokens": record.output_tokens,
        "prompt_tokens": record.prompt_tokens,
        "input_tokens": record.input_tokens,
        "output_tokens_from": record.tokens_from,
        "ended": record.ended,
    }

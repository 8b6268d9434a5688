"""What a rollout collects of each revision's answers, to judge the new one against the old.

Every gateway worker of every replica sees a share of both revisions' traffic, so what each
collects must add up exactly: counts, and latencies as histograms over fixed log-spaced
buckets (a bucket per 5%, from a microsecond to a thousand seconds), whose counts add bucket
by bucket. A sorted list of samples would add up too, but would grow with the traffic and
cross the wire whole; a histogram is at most `BUCKETS` integers, and in practice a few dozen.
Its 5% resolution is finer than any latency difference worth rolling back for.

Time to first token is judged per uncached prompt token: a revision that happens to get the
longer prompts is not slower for it. The count is floored at `TTFT_TOKEN_FLOOR`, so that a
prompt its cache held whole (a few tokens to compute) does not divide its fixed cost by ~0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

RATIO = 1.05  # between a bucket's bounds
LOWEST = 1e-6  # seconds: the lowest bucket's lower bound; anything below counts there
HIGHEST = 1e3  # seconds: the highest bucket's upper bound; anything above counts there
BUCKETS = math.ceil(math.log(HIGHEST / LOWEST) / math.log(RATIO))
TTFT_TOKEN_FLOOR = 16  # uncached prompt tokens a first token's time is divided by, at least
WIRE_VERSION = 1  # of the bucket scheme: windows of different schemes do not add up

_LOG_RATIO = math.log(RATIO)


def bucket(x: float) -> int:
    """The index of the bucket `x` seconds counts in, clamped to the end buckets."""
    if not x > LOWEST:
        return 0
    if x >= HIGHEST:
        return BUCKETS - 1
    return int(math.log(x / LOWEST) / _LOG_RATIO)


def middle(index: int) -> float:
    """A bucket's geometric middle: within a factor of √RATIO of anything counted in it."""
    return LOWEST * math.exp((index + 0.5) * _LOG_RATIO)


@dataclass(slots=True)
class Histogram:
    """Counts of samples by bucket index; only buckets that hold some are kept."""

    counts: dict[int, int] = field(default_factory=dict)
    count: int = 0

    def add(self, x: float) -> None:
        """Count one sample of `x` seconds; a NaN is no sample, and is skipped."""
        if math.isnan(x):
            return
        i = bucket(x)
        self.counts[i] = self.counts.get(i, 0) + 1
        self.count += 1

    def merge(self, other: Histogram) -> None:
        """Add `other`'s counts to this one's (in place)."""
        for i, n in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + n
        self.count += other.count

    def items(self) -> list[tuple[int, int]]:
        """(bucket index, count) by increasing index."""
        return sorted(self.counts.items())

    def quantile(self, q: float) -> float | None:
        """The middle of the bucket holding the `q`-quantile (the smallest sample with at
        least `q` of them at or below it); None when there is no sample."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count - 1e-9))
        seen = 0
        for i, n in self.items():
            seen += n
            if seen >= rank:
                return middle(i)
        return middle(max(self.counts))

    def above(self, x: float) -> int:
        """How many samples are in buckets whose middle is above `x`."""
        return sum(n for i, n in self.counts.items() if middle(i) > x)

    def to_wire(self) -> tuple[list[int], list[int]]:
        """(bucket indices, their counts), by increasing index."""
        pairs = self.items()
        return [i for i, _ in pairs], [n for _, n in pairs]

    @classmethod
    def from_wire(cls, indices: object, counts: object, key: str) -> Histogram:
        if not isinstance(indices, list) or not isinstance(counts, list):
            raise ValueError(f"{key}: bucket indices and counts must be lists")
        if len(indices) != len(counts):
            raise ValueError(f"{key}: {len(indices)} bucket indices for {len(counts)} counts")
        histogram = cls()
        for i, n in zip(indices, counts, strict=True):
            if not _natural(i) or i >= BUCKETS or not _natural(n):
                raise ValueError(f"{key}: bad bucket {i!r} with count {n!r}")
            histogram.counts[i] = histogram.counts.get(i, 0) + n
            histogram.count += n
        return histogram


_COUNTS = ("requests", "errors", "breaks", "resumed", "stops", "lengths", "others")


@dataclass(slots=True)
class Window:
    """One revision's answers over one judging window.

    `requests` counts every request that ended; `errors` those whose client got an error
    before any of the answer (a 5xx, or a failure before the first byte); `breaks` the
    streams that broke after their first byte, `resumed` those of them continued on another
    unit. `stops`, `lengths` and `others` count the finish reasons the answers ended with.
    """

    requests: int = 0
    errors: int = 0
    breaks: int = 0
    resumed: int = 0
    stops: int = 0
    lengths: int = 0
    others: int = 0
    ttft: Histogram = field(default_factory=Histogram)  # seconds per uncached prompt token
    tpot: Histogram = field(default_factory=Histogram)  # seconds per output token

    def add(
        self,
        *,
        error: bool = False,
        broke: bool = False,
        resumed: bool = False,
        finish: str | None = None,
        ttft: float | None = None,
        uncached_tokens: int = 0,
        tpot: float | None = None,
    ) -> None:
        """Count one request that ended; latencies left unknown (None) are not sampled."""
        self.requests += 1
        if error:
            self.errors += 1
        if broke:
            self.breaks += 1
            self.resumed += resumed
        if finish == "stop":
            self.stops += 1
        elif finish == "length":
            self.lengths += 1
        elif finish is not None:
            self.others += 1
        if ttft is not None:
            self.ttft.add(ttft / max(uncached_tokens, TTFT_TOKEN_FLOOR))
        if tpot is not None:
            self.tpot.add(tpot)

    def merge(self, other: Window) -> None:
        """Add `other`'s answers to this window's (in place)."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.ttft.merge(other.ttft)
        self.tpot.merge(other.tpot)

    @property
    def empty(self) -> bool:
        return self.requests == 0

    @property
    def begun(self) -> int:
        """Requests whose answer began: those a stream break could happen to."""
        return self.requests - self.errors

    @property
    def finished(self) -> int:
        """Answers that ended with a finish reason."""
        return self.stops + self.lengths + self.others

    def to_wire(self) -> dict[str, int | list[int]]:
        wire: dict[str, int | list[int]] = {"v": WIRE_VERSION}
        wire.update((name, getattr(self, name)) for name in _COUNTS)
        wire["ttft_buckets"], wire["ttft_counts"] = self.ttft.to_wire()
        wire["tpot_buckets"], wire["tpot_counts"] = self.tpot.to_wire()
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, object]) -> Window:
        """The window `to_wire` encoded; a ValueError names the key that is wrong."""
        if wire.get("v") != WIRE_VERSION:
            raise ValueError(f"v: bucket scheme {wire.get('v')!r}, not {WIRE_VERSION}")
        window = cls(
            ttft=Histogram.from_wire(wire.get("ttft_buckets"), wire.get("ttft_counts"), "ttft"),
            tpot=Histogram.from_wire(wire.get("tpot_buckets"), wire.get("tpot_counts"), "tpot"),
        )
        for name in _COUNTS:
            value = wire.get(name, 0)
            if not _natural(value):
                raise ValueError(f"{name}: {value!r} is not a count")
            setattr(window, name, value)
        return window


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

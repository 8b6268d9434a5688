"""When a stream has gone quiet: judged against its own pace, not a fixed second.

A stream's tokens arrive at its engine's pace: 20 ms apart on a small model, a second apart
on a big one under load. A fixed "quiet for 1 s" rule calls the second kind dead between any
two tokens. A stream is quiet once it has gone `factor` times its own recent gap between
reads without data, and never sooner than `floor` seconds (a gap is noisy while a stream is
young). Pure, with the clock passed in.
"""

from __future__ import annotations

from typing import Protocol

# Weight of the newest gap in a stream's running estimate: about the last four gaps count.
GAP_WEIGHT = 0.25


def next_gap(gap: float | None, observed: float) -> float:
    """The running estimate after one more gap between reads."""
    return observed if gap is None else gap + GAP_WEIGHT * (observed - gap)


def quiet_after(gap: float | None, floor: float, factor: float) -> float:
    """Seconds without data after which a stream with this gap estimate is quiet."""
    return floor if gap is None else max(floor, factor * gap)


def is_quiet(now: float, last: float, gap: float | None, floor: float, factor: float) -> bool:
    return now - last > quiet_after(gap, floor, factor)


class GapSink(Protocol):
    """Takes the seconds between two relayed chunks (a lock-free histogram, in practice):
    one by one (the Python relay), or as counts per bucket of `bounds` and their sum at the
    end of an answer (the native relay counts them as it goes)."""

    @property
    def bounds(self) -> tuple[float, ...]: ...

    def observe(self, value: float) -> None: ...

    def merge(self, counts: list[int], total: float) -> None: ...

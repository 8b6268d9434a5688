"""Python's garbage collector as the event loop feels it: how long each collection stopped it.

A collection runs inside whatever allocation set it off, on that thread, with the interpreter
held: on the loop's thread every stream in flight waits for it. `unitgate_gc_pause_seconds`
is a histogram of collections by generation (0 young, 2 full), timed by `gc.callbacks` (the
interpreter calls them at each collection's start and stop). prometheus_client's own
`python_gc_*` families count collections, not their time, and this registry does not carry
them. Installed while the gateway runs; about a microsecond a collection.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from gateway.observability.histogram import LATENCY_BUCKETS, Histogram, HistogramFamily

# From a young collection of a few hundred objects to a full one over a large heap: finer
# steps below the latency buckets' first, theirs up to 0.25 s, then 1 s.
PAUSE_BUCKETS = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    *(b for b in LATENCY_BUCKETS if b <= 0.25),
    1.0,
)
GENERATIONS = ("0", "1", "2")


class GcPauses:
    """The histogram family, and the callback that feeds it while installed. Collections never
    overlap (the interpreter runs one at a time, callbacks included), so one start time does."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.family = HistogramFamily(
            "unitgate_gc_pause_seconds",
            "Python garbage collections by generation (0 young, 2 full) and how long each"
            " stopped the process's thread (on the event loop's: every stream in flight).",
            "generation",
            PAUSE_BUCKETS,
        )
        self._by_generation: tuple[Histogram, ...] = tuple(
            self.family.labels(g) for g in GENERATIONS
        )
        self._started: float | None = None

    def install(self) -> None:
        """Time collections from now on (once, however often called)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        self._started = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self.clock()
            return
        started, self._started = self._started, None
        generation = info.get("generation")
        if started is None or not isinstance(generation, int):
            return  # installed mid-collection
        if 0 <= generation < len(self._by_generation):
            self._by_generation[generation].observe(self.clock() - started)

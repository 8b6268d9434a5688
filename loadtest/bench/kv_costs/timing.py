"""CPU time per call, read from the process's CPU clock.

The machine these run on is shared (two cores, other work on them): wall time would count the
time this process waits for a core; its CPU clock counts only what it ran, though another's
work still slows it (caches, the core's other thread). Calls far shorter than the clock's read
(a system call, about half a microsecond) are timed in rounds of many, and the fastest round
is kept, as timeit advises: interference only ever adds. Calls that must each have an input
of their own are timed one by one, and the median kept.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
ROUNDS = 5


def cpu_us(call: Callable[[], object], budget_s: float = 0.15, rounds: int = ROUNDS) -> float:
    """CPU microseconds of one `call`, in the fastest of `rounds` rounds filling `budget_s`."""
    start = time.process_time_ns()
    call()  # once to size the rounds (and warm what a first call warms)
    once = max(time.process_time_ns() - start, 1_000)
    calls = max(1, int(budget_s * 1e9 / rounds / once))
    per_call = []
    for _ in range(rounds):
        start = time.process_time_ns()
        for _ in range(calls):
            call()
        per_call.append((time.process_time_ns() - start) / calls / 1e3)
    return min(per_call)


def cpu_us_each(call: Callable[[T], object], inputs: Sequence[T]) -> float:
    """Median CPU microseconds of `call` on each of `inputs` (calls long enough to time one
    by one, on inputs that must each be new)."""
    per_call = []
    for value in inputs:
        start = time.process_time_ns()
        call(value)
        per_call.append((time.process_time_ns() - start) / 1e3)
    return statistics.median(per_call)

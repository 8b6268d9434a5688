"""The breaker's classifier: which traffic outcomes are evidence against a unit.

linkerd splits circuit breaking into a classifier (is this response a failure?), the breaker
(state) and the gate (enforcement). This is the first part. It matters most under load, where
the gateway itself causes ends that look like failures: a stream it broke because the unit
was ejected, a client that left, a shutdown, a request that ran out of its own `total` budget.
Counting those trips breakers, which ejects units, which breaks more streams: a feedback loop
that turned a burst of 5,000 streams into thousands of errors. Only what the unit caused
counts: resets, 5xx, error events, bodies cut short, and timeouts the unit's pace cannot
explain. Pure: every input is passed in.
"""

from __future__ import annotations

from enum import StrEnum

from gateway.outcomes import End, Failure


class Evidence(StrEnum):
    OK = "ok"
    FAILURE = "failure"
    NONE = "none"  # says nothing about the unit: the breaker does not hear of it


# Ends the gateway (or the request's own deadline) caused, never the unit.
SELF_INFLICTED = frozenset({End.CLIENT_GONE, End.UNIT_EJECTED, End.TOTAL_TIMEOUT, End.SHUTDOWN})


def stream_end(kind: End, gap: float | None, idle: float, pace_factor: float) -> Evidence:
    """How a relayed answer ended. An idle timeout on a stream whose own pace is that slow
    (`pace_factor` x its gap reaches `idle`) is the unit being the unit, not failing."""
    if kind is End.COMPLETE:
        return Evidence.OK
    if kind in SELF_INFLICTED:
        return Evidence.NONE
    if kind is End.IDLE_TIMEOUT and gap is not None and pace_factor * gap >= idle:
        return Evidence.NONE
    return Evidence.FAILURE


def attempt_failure(kind: Failure, flowing: bool) -> Evidence:
    """A failed attempt before the first byte (errors.UpstreamError kinds). A connect or
    first-byte timeout on a unit whose other streams keep their pace is its queues: load, not
    failure (a burst of thousands of requests fills its accept queue, then waits for prefill
    slots). A refused connection, a reset or a 5xx is a failure whatever else flows."""
    if kind is Failure.LOCAL or (kind.timeout and flowing):
        return Evidence.NONE  # LOCAL: the gateway's own resources (its open-files limit)
    return Evidence.FAILURE

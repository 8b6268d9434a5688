"""What one probe of one node saw: the seam between the probe (I/O) and the verdict (policy).

The probe only reports facts; whether a wrong rank or a frozen step makes the unit unusable
is the verdict's call, so the rules can be tested without sockets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeReport:
    """`error` is None when the node answered HTTP 200 with a JSON object; `timed_out` marks
    the one soft error, no answer within the probe's deadline (see verdict.py)."""

    latency_ms: float | None
    error: str | None = None
    status: str | None = None
    unit: str | None = None
    role: str | None = None
    rank: int | None = None
    pid: int | None = None
    step: int | None = None
    pending: int | None = None
    running: int | None = None  # the leader's sequences holding KV slots (`kv_slots_used`)
    timed_out: bool = False
    kv_usage: float | None = None  # the share of the leader's KV cache in use, if it says
    # What the stall check compares between rounds where `step` alone can stand still while
    # the engine works (a stock vLLM's long prefill: kinds/vllm_metrics.py); None: `step`.
    progress: int | None = None
    # False when the kind read no new load this round (a stock vLLM's /metrics is read every
    # `load_interval`, the counts above are then the last read's): the stall check skips it.
    fresh: bool = True
    # The engine's own report of work moving, for a leader whose probe timed out (a stock
    # vLLM's /metrics): the loop time its latest report was asked for, when that report showed
    # requests running or waiting and progress changed since the report before; None when it
    # did not, or there is none. Carried as read, never restamped: its age is the verdict's.
    busy_at: float | None = None
    # The leader answers a tied request's head when its engine starts it (a builtin engine's
    # `tied_requests`): hedging may send such a unit both copies at once (proxy/dispatch.py).
    tied: bool = False

"""A unit's health as its prober judges it, and why soft evidence is kept apart from hard.

`unknown` until a probe round has judged the unit: a gateway that has not looked yet must not
claim it can route there. `slow` is a unit whose probes time out while its live traffic keeps
flowing (or its leader's own fresh report shows its engine working): a busy leader answers
`/health` late, but it serves, so it stays routable (at a lower weight) instead of being
ejected. `unhealthy` carries whether the evidence was hard (refused, reset, wrong identity,
5xx, stalled, failed canary) or soft (timeouts alone): panic routing may send traffic to a
soft-unhealthy unit, never to a hard one.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Health(StrEnum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    SLOW = "slow"
    UNHEALTHY = "unhealthy"

    @property
    def routable(self) -> bool:
        return self is Health.HEALTHY or self is Health.SLOW


class Lag(NamedTuple):
    """Why a unit that passes its probes is `slow` all the same (its learned latency lags the
    fleet's, or it is on probation), and the share of `[health].slow_weight` it keeps: 1.0,
    or less for a straggler whose first copies hedges keep overtaking (routing/overtaken.py)."""

    reason: str
    share: float = 1.0


class Outcome(StrEnum):
    """One probe round's class."""

    GOOD = "good"
    SLOW = "slow"  # only timeouts, while the unit's traffic flows (or its engine works)
    BAD = "bad"

"""Settings of hedged requests: `[hedge]`.

A streamed request whose first unit has not produced its first token after a delay is sent to a
second unit as well; the first of the two to produce one is relayed, the other is cancelled
(gateway/routing/hedge.py, gateway/proxy/hedging.py). Which requests may be hedged: with
`[priority]`, each class's `hedge` (the default classes hedge `interactive` only); without it,
`enabled`. The budget and the overload rule keep a partial outage from being doubled by its
own hedges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.config.checks import check


@dataclass(frozen=True, slots=True)
class HedgeConfig:
    # Without [priority]: whether requests are hedged at all (with it, each class says).
    enabled: bool = False
    # The delay: this multiple of the request's predicted time to first token on its first
    # unit or on the best other unit, whichever is sooner, within [min_delay, max_delay]
    # seconds; max_delay where nothing is predicted.
    delay_factor: float = 2.0
    min_delay: float = 0.05
    max_delay: float = 2.0
    # Hedged uncached prompt tokens at most this share of all requests' uncached prompt
    # tokens over the last `budget_window` seconds.
    budget_share: float = 0.05
    budget_window: float = 30.0
    # No hedge while the fleet is overloaded: more than `max_queued` requests wait for a slot,
    # more than `max_unroutable_share` of the units are out (ejected, unhealthy), or more than
    # `max_failure_rate` of the last `budget_window`'s attempts failed.
    max_queued: int = 0
    max_unroutable_share: float = 0.25
    max_failure_rate: float = 0.1
    # Tied requests: where the first unit and another announce when they start a request
    # (builtin engines do), a twin goes if the first has not started within `tie_delay`
    # seconds, and the first to start wins; the other is closed, most often before its
    # prefill. False: such units are hedged after the delay.
    tie: bool = True
    tie_delay: float = 0.05
    # Probation: a unit whose first copies a hedge overtook before they began, in more than
    # this share of its answers over `budget_window` (and 3x the fleet's median), is `slow`,
    # at the share of slow_weight its copies that began make (gateway/routing/overtaken.py).
    # 0 = never.
    probation: float = 0.05

    def __post_init__(self) -> None:
        check(
            0.0 < self.delay_factor < math.inf,
            "delay_factor",
            self.delay_factor,
            "must be > 0 and finite",
        )
        check(
            0.0 < self.min_delay <= self.max_delay < math.inf,
            "min_delay",
            self.min_delay,
            f"must be > 0 and at most max_delay ({self.max_delay!r}), both finite seconds",
        )
        check(0.0 <= self.budget_share <= 1.0, "budget_share", self.budget_share, "must be 0..1")
        check(
            1.0 <= self.budget_window <= 3600.0,
            "budget_window",
            self.budget_window,
            "must be 1..3600 s",
        )
        check(self.max_queued >= 0, "max_queued", self.max_queued, "must be >= 0")
        check(
            0.0 <= self.tie_delay < math.inf,
            "tie_delay",
            self.tie_delay,
            "must be >= 0 and finite seconds",
        )
        for name in ("max_unroutable_share", "max_failure_rate", "probation"):
            value = getattr(self, name)
            check(0.0 <= value <= 1.0, name, value, "must be 0..1")

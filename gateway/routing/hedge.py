"""Hedging's rules: which request may be hedged, after how long, and whether the fleet can
afford a second copy now. Pure and synchronous; the clock comes in as `now`.

A hedge is a second copy of a request that has not produced its first token after a delay,
sent to another unit; the first copy to produce a token is relayed and the other cancelled
("The Tail at Scale"). What keeps it from hurting:

- **The delay is per request**: a multiple (`delay_factor`) of the time to first token the
  latency model predicts for this request (its uncached prompt tokens, the unit's queue), on
  its first unit or on the best other unit, whichever is sooner, within [`min_delay`,
  `max_delay`]. A long prompt on a busy fleet is given the time it needs; a short one is
  hedged soon. The other units count because a unit's own prediction is learned from its own
  answers: a unit that stalls every request would otherwise earn itself a delay as long as
  its stalls, and never be hedged. Before a unit's model has learned, its recent first tokens
  for prompts of a similar length stand in (their 90th percentile: observed.py). With neither
  (the model off, or nothing answered yet) the delay is `max_delay`, asked again while the
  copy waits (proxy/races.py).
- **A budget in prefill tokens**: the hedged copies' uncached prompt tokens are at most
  `budget_share` of all requests' uncached prompt tokens over `budget_window`. A token count,
  not a request count: one hedged 30,000-token prompt costs what a thousand short ones do.
- **No hedging under overload**: requests queue for slots, a share of the units is out, or
  attempts fail at a high rate. A partial outage must not be doubled by its own hedges.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.hedge import HedgeConfig
from gateway.routing.window import SlidingSums

_PREFILL, _HEDGED, _ATTEMPTS, _FAILED = range(4)


@dataclass(frozen=True, slots=True)
class FleetNow:
    """What the overload rule looks at, read when a hedge is considered."""

    queued: int  # requests waiting for an admission slot
    units: int  # units of the request's model
    unroutable: int  # of those, out: ejected, unhealthy, disabled


class Hedging:
    """The budget's and the overload rule's running sums, and the decisions made on them."""

    def __init__(self, config: HedgeConfig) -> None:
        self.config = config
        self._sums = SlidingSums(config.budget_window, 4)

    # -- what every request adds ----------------------------------------------------------

    def prefill(self, tokens: int, now: float) -> None:
        """A request's uncached prompt tokens (hedged or not): the budget's base."""
        self._sums.add(now, _PREFILL, max(tokens, 0))

    def attempted(self, failed: bool, now: float) -> None:
        """An attempt's outcome before its first byte: the failure rate's sample."""
        self._sums.add(now, _ATTEMPTS)
        if failed:
            self._sums.add(now, _FAILED)

    # -- the decisions --------------------------------------------------------------------

    def delay(self, predicted_ttft: float | None, elsewhere: float | None = None) -> float:
        """Seconds to wait for the first unit's first token before sending a second copy:
        `predicted_ttft` is the request's predicted time to first token on its unit,
        `elsewhere` the least predicted on another unit it could go to (None: not known)."""
        c = self.config
        known = [t for t in (predicted_ttft, elsewhere) if t is not None and t > 0]
        if not known:
            return c.max_delay
        return min(c.max_delay, max(c.min_delay, c.delay_factor * min(known)))

    def refusal(self, tokens: int, fleet: FleetNow, now: float) -> str | None:
        """Why a copy of `tokens` uncached prompt tokens may not be sent now, as "budget: ..."
        or "overloaded: ..." (None: it may)."""
        c = self.config
        if fleet.queued > c.max_queued:
            return "overloaded: requests wait for a slot"
        if fleet.units and fleet.unroutable > c.max_unroutable_share * fleet.units:
            return "overloaded: too many units are out"
        attempts = self._sums.total(now, _ATTEMPTS)
        if attempts and self._sums.total(now, _FAILED) > c.max_failure_rate * attempts:
            return "overloaded: attempts fail"
        allowed = c.budget_share * self._sums.total(now, _PREFILL)
        if self._sums.total(now, _HEDGED) + max(tokens, 1) > allowed:
            return "budget: hedged prefill tokens are at their share"
        return None

    def spend(self, tokens: int, now: float) -> None:
        """A second copy was sent: its uncached prompt tokens count against the budget."""
        self._sums.add(now, _HEDGED, max(tokens, 1))

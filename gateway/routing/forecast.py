"""The fleet's latency forecast: each unit's learned model (latency.py), and the prefill work
this gateway has sent each unit that has not yet come back as a first token.

Pure and synchronous: the request path's feed (proxy/forecast_feed.py) tells it when an attempt was
sent, when its first token came and when it ended, with the loop's time; the dispatcher asks
it what each candidate would cost a request. O(1) per unit per decision.

What a placement costs: the unit's predicted time to first token for the prompt tokens its
cache does not hold, with the prefill queued ahead and the requests it runs, plus its
predicted time per output token at one more running request, times `DECODE_HORIZON`: a unit
whose decode batch is full answers the first token soon but the next ones slowly.

Learning costs about 30 us of Python per request (two recursive least-squares updates; more
on a loop whose caches the relay keeps cold), so once a unit's fit is learned, and while its
answers do not surprise it, it learns from at most one first token and one answer's pace per
`learn_every` seconds: at the rates where that would matter, the observations are plentiful.
Until then it learns from every answer, so that a new unit is learned, and a changed one
relearned, within a few answers.

The queue is this gateway's own knowledge: other replicas' requests on a unit show only in
its running count (`UnitState.foreign`, from its leader's load report).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from gateway.routing.latency import UnitLatency
from gateway.routing.observed import ObservedTtft
from gateway.routing.overtaken import Overtaken

# Output tokens a placement is charged its unit's decode load for: the first lines a reader
# sees. Larger weighs decode load more against prefill.
DECODE_HORIZON = 16

# A unit's fitted figures, as `figures()` names them (and the metrics export them): its time
# to first token for 1,000 uncached prompt tokens when idle, then the coefficients of
# ttft = base + per_kilotoken_uncached x k + per_kilotoken_queued x k + per_running x n and
# tpot = base + per_running x n (seconds).
FIGURES = (
    "ttft_1k_idle",
    "ttft_base",
    "ttft_per_kilotoken_uncached",
    "ttft_per_kilotoken_queued",
    "ttft_per_running",
    "tpot_base",
    "tpot_per_running",
)


class Estimate(NamedTuple):
    ttft: float  # predicted seconds to the first token
    cost: float  # ttft plus DECODE_HORIZON tokens at the unit's predicted pace


class Placed:
    """One attempt's placement: what the dispatcher decided, then what the feed saw."""

    __slots__ = (
        "cached",
        "opened",
        "pending",
        "predicted",
        "prompt",
        "queued",
        "running",
        "sent",
        "uncached",
        "unit",
    )

    def __init__(self, unit: str, prompt: int, cached: int, predicted: float | None) -> None:
        self.unit = unit
        self.prompt = prompt  # the prompt's tokens (counted, or estimated from its bytes)
        self.cached = cached  # of them, those the unit's cache holds (its KV events)
        self.uncached = max(0, prompt - cached)  # those it computes
        self.predicted = predicted  # seconds to the first token, if the unit's model knew
        self.queued = 0  # prefill tokens this gateway had queued on the unit when it was sent
        self.running = 0  # requests on the unit when it was sent
        self.sent = 0.0  # loop time it was sent (0: not yet)
        self.opened = 0.0  # loop time its first token came (0: not yet)
        self.pending = False  # its uncached tokens are in the unit's queue


class Forecast:
    def __init__(
        self,
        forget: float = 0.99,
        least: int = 20,
        learn_every: float = 0.5,
        window: float = 30.0,
    ) -> None:
        """`window`: seconds over which each unit's copies overtaken by a hedge are counted
        (overtaken.py: what its first tokens cannot tell)."""
        self.forget, self.least, self.learn_every = forget, least, learn_every
        self.units: dict[str, UnitLatency] = {}
        self.overtaken = Overtaken(window)
        self.observed = ObservedTtft()  # each unit's recent first tokens, before a model
        self.latest = 0.0  # the latest time the feed told: `figures`' clock
        self.queued: dict[str, int] = {}  # unit -> uncached prompt tokens sent, not yet answered
        # unit -> when its model last learned a first token, and an answer's pace
        self._learned: dict[str, list[float]] = {}

    def _due(self, unit: str, which: int, now: float) -> bool:
        """Whether the unit's model learns from this answer (of `which`: 0 its first token, 1
        its pace)."""
        times = self._learned.get(unit)
        if times is None:
            times = self._learned[unit] = [-float("inf"), -float("inf")]
        model = self.units.get(unit)
        fit = None if model is None else model.ttft if which == 0 else model.tpot
        settled = fit is not None and fit.samples >= self.least and not fit.surprised
        if settled and now - times[which] < self.learn_every:
            return False
        times[which] = now
        return True

    def model(self, unit: str) -> UnitLatency:
        model = self.units.get(unit)
        if model is None:
            model = self.units[unit] = UnitLatency(self.forget, self.least)
        return model

    def drop(self, unit: str) -> None:
        """The unit left the fleet: what was learned of it goes (a unit of the same id added
        later may be another machine)."""
        self.units.pop(unit, None)
        self.queued.pop(unit, None)
        self._learned.pop(unit, None)
        self.overtaken.drop(unit)
        self.observed.drop(unit)

    def estimate(self, unit: str, uncached: int, running: int) -> Estimate | None:
        """What placing a request with `uncached` prompt tokens on `unit`, now running
        `running` requests, would cost; None until the unit's model has learned enough."""
        model = self.units.get(unit)
        if model is None or not model.learned:
            return None
        ttft = model.predict_ttft(uncached, self.queued.get(unit, 0), running)
        tpot = model.predict_tpot(running + 1)
        assert ttft is not None and tpot is not None  # learned
        return Estimate(ttft, ttft + DECODE_HORIZON * tpot)

    def ttft(self, unit: str, uncached: int, running: int) -> float | None:
        """The time to first token of a request with `uncached` prompt tokens on `unit`,
        now running `running` requests: its model's prediction once learned, else the 90th
        percentile of its recent first tokens for prompts of about that length (observed.py);
        None while neither is known."""
        estimate = self.estimate(unit, uncached, running)
        if estimate is not None:
            return estimate.ttft
        return self.observed.p90(unit, uncached)

    def estimates(
        self, units: Iterable[tuple[str, int]], prompt: int, cached: Mapping[str, int]
    ) -> dict[str, Estimate] | None:
        """For each (unit, running) of the candidates, its Estimate for a prompt of `prompt`
        tokens of which `cached[unit]` are in its cache; None if any unit's model has not
        learned enough yet (the caller routes as if there were no forecast, which is how an
        unlearned unit gets the traffic it learns from)."""
        found: dict[str, Estimate] = {}
        for unit, running in units:
            estimate = self.estimate(unit, max(0, prompt - cached.get(unit, 0)), running)
            if estimate is None:
                return None
            found[unit] = estimate
        return found

    def sent(self, placed: Placed, running: int, now: float) -> None:
        """The attempt went out to its unit, which then ran `running` other requests."""
        placed.queued = self.queued.get(placed.unit, 0)
        placed.running, placed.sent = running, now
        self.latest = now
        self.queued[placed.unit] = placed.queued + placed.uncached
        placed.pending = True

    def first_token(self, placed: Placed, now: float) -> None:
        """Its first token came: the unit's model learns how long it took."""
        self.unqueue(placed)
        if placed.sent <= 0.0 or placed.unit not in self.queued:
            return  # never sent, or its unit left the fleet meanwhile
        placed.opened = self.latest = now
        self.overtaken.begun(placed.unit, now)
        self.observed.add(placed.unit, placed.uncached, now - placed.sent)
        if self._due(placed.unit, 0, now):
            model = self.model(placed.unit)
            model.first_token(placed.uncached, placed.queued, placed.running, now - placed.sent)

    def unqueue(self, placed: Placed) -> None:
        """Its prefill is no longer ahead of anyone's (answered, failed or abandoned)."""
        if not placed.pending:
            return
        placed.pending = False
        left = self.queued.get(placed.unit)
        if left is not None:
            self.queued[placed.unit] = max(0, left - placed.uncached)

    def finished(self, placed: Placed, gap: float | None, now: float) -> None:
        """Its stream ended whole, its own gap between reads last `gap` seconds (relay.gap:
        a running estimate over the last few): the unit's pace per token."""
        if placed.opened <= 0.0 or gap is None or placed.unit not in self.queued:
            return
        if self._due(placed.unit, 1, now):
            self.model(placed.unit).token_gap(placed.running, gap)

    def hedge_overtook(self, unit: str, now: float) -> None:
        """A hedge's second copy answered first while `unit`'s first copy had not begun."""
        if unit in self.queued:  # not a unit that left the fleet meanwhile
            self.overtaken.overtaken(unit, now)
            self.latest = now

    def figures(self, now: float | None = None) -> dict[str, dict[str, float]]:
        """Each learned unit's fitted figures by name (FIGURES), for the metrics, the status
        page and, from a worker, the control plane; with `overtaken_share` where enough of
        its answers were counted over the window up to `now` (overtaken.py; None: the latest
        time it was told, so a scrape from another thread needs no clock), alone for a unit
        not learned yet: one whose every copy a hedge overtakes never gets a first token to
        learn from. Only reads."""
        now = self.latest if now is None else now
        found: dict[str, dict[str, float]] = {}
        for unit, model in self.units.items():
            first_k = model.prefill_per_ktoken
            if first_k is None or not model.learned:
                continue
            values = (first_k, *model.ttft.theta, *model.tpot.theta)
            found[unit] = dict(zip(FIGURES, values, strict=True))
            found[unit]["queued_tokens"] = float(self.queued.get(unit, 0))
        for unit, share in self.overtaken.shares(now):
            found.setdefault(unit, {})["overtaken_share"] = share
        return found

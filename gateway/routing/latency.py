"""How long each unit will take to answer, learned online from what the gateway observes: its
time to first token against the prompt tokens it had to compute (those its cache did not
hold), the prefill work queued ahead and the requests it was running, and its time per output
token against the requests it was running. Pure and synchronous: the request path feeds
observations, routing asks for predictions; O(1) each, no sidecar.

Each unit's figures are fitted by recursive least squares with a forgetting factor: an
observation's weight halves every ln(2) / (1 - forget) observations (70 with the default
0.99), so a unit whose speed changes (a lagging node, a noisy neighbour, a new revision) is
relearned within a few hundred requests, and units of different speeds get different
coefficients without configuration.

Forgetting alone relearns a gradual drift; an abrupt change (a unit that recovers from a
lagging node, while the forecast sends it only the few requests that keep its model fresh)
would take hundreds of its observations. So `SURPRISES` observations in a row that miss
their prediction by more than a factor of `SURPRISE` reset the estimator's uncertainty: the
next few observations then move the fit as the first ones did.

Token counts enter in thousands, so that the coefficients are seconds per thousand tokens
and the fit stays well conditioned. A direction the observations never excite (every prompt
the same length) would let the estimator's covariance grow without bound under forgetting:
it is capped (`MAX_VARIANCE`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from operator import mul

MAX_VARIANCE = 1e6
PRIOR_VARIANCE = 1e3
SURPRISE = 2.0  # an observation more than this factor off its prediction, either way
SURPRISES = 3  # in a row: a new regime
SURPRISE_FLOOR = 0.005  # seconds: a miss smaller than this surprises nobody


class Rls:
    """y ~ theta . x, fitted by recursive least squares with exponential forgetting."""

    __slots__ = ("forget", "p", "samples", "surprised", "theta")

    def __init__(self, n: int, forget: float = 0.99) -> None:
        if not 0.5 < forget <= 1.0:
            raise ValueError(f"forget must be in (0.5, 1], not {forget!r}")
        self.forget = forget
        self.theta = [0.0] * n
        self.p = self._prior()
        self.samples = 0
        self.surprised = 0  # observations in a row far off their prediction

    def _prior(self) -> list[list[float]]:
        n = len(self.theta)
        return [[PRIOR_VARIANCE if i == j else 0.0 for j in range(n)] for i in range(n)]

    def predict(self, x: Sequence[float]) -> float:
        return float(sum(map(mul, self.theta, x)))

    def update(self, x: Sequence[float], y: float) -> None:
        # (map and zip over rows keep the arithmetic in C: a third of the loops' time)
        if not math.isfinite(y) or not all(map(math.isfinite, x)):
            return
        predicted = self.predict(x)
        if self.samples:
            self._judge(predicted, y)
        p, inverse = self.p, 1.0 / self.forget
        px = [sum(map(mul, row, x)) for row in p]
        scale = 1.0 / (self.forget + sum(map(mul, x, px)))
        gain = [v * scale for v in px]
        error = y - predicted  # (a reset by _judge leaves theta as it was)
        self.theta = [t + g * error for t, g in zip(self.theta, gain, strict=True)]
        p = self.p = [
            [(pij - gi * pxj) * inverse for pij, pxj in zip(row, px, strict=True)]
            for row, gi in zip(p, gain, strict=True)
        ]
        for i, row in enumerate(p):
            if row[i] > MAX_VARIANCE:  # an unexcited direction: hold its uncertainty there
                scale = math.sqrt(MAX_VARIANCE / row[i])
                for j in range(len(p)):
                    p[i][j] *= scale
                    p[j][i] *= scale
        self.samples += 1

    def _judge(self, predicted: float, y: float) -> None:
        """Count a surprise; at SURPRISES in a row, forget how sure the fit was."""
        if abs(y - predicted) > SURPRISE_FLOOR and (
            y > SURPRISE * predicted or y * SURPRISE < predicted
        ):
            self.surprised += 1
            if self.surprised >= SURPRISES:
                self.p, self.surprised = self._prior(), 0
        else:
            self.surprised = 0


class UnitLatency:
    """One unit's learned time to first token and time per output token."""

    __slots__ = ("least", "tpot", "ttft")

    def __init__(self, forget: float = 0.99, least: int = 20) -> None:
        # ttft = a + b * uncached_k + c * queued_k + d * running;  tpot = e + f * running
        self.ttft = Rls(4, forget)
        self.tpot = Rls(2, forget)
        self.least = least  # observations before a prediction is trusted

    def first_token(self, uncached: int, queued: int, running: int, seconds: float) -> None:
        """A request's first token came `seconds` after it was sent, with `uncached` prompt
        tokens to compute, `queued` prompt tokens of other requests ahead of it and `running`
        other requests on the unit."""
        self.ttft.update((1.0, uncached / 1000, queued / 1000, float(running)), seconds)

    def token_gap(self, running: int, seconds: float) -> None:
        """A stream's mean time per output token while the unit ran `running` requests."""
        self.tpot.update((1.0, float(running)), seconds)

    def predict_ttft(self, uncached: int, queued: int, running: int = 0) -> float | None:
        if self.ttft.samples < self.least:
            return None
        # The fit's features, written out: asked of every candidate of every request, where
        # a tuple and Rls.predict's call would cost more than the arithmetic.
        a, b, c, d = self.ttft.theta
        ttft = a + b * uncached / 1000 + c * queued / 1000 + d * running
        return ttft if ttft > 0.0 else 0.0

    def predict_tpot(self, running: int) -> float | None:
        if self.tpot.samples < self.least:
            return None
        e, f = self.tpot.theta
        tpot = e + f * running
        return tpot if tpot > 0.0 else 0.0

    @property
    def learned(self) -> bool:
        return self.ttft.samples >= self.least and self.tpot.samples >= self.least

    @property
    def prefill_per_ktoken(self) -> float | None:
        """Seconds to the first token of a thousand uncached prompt tokens on the idle unit,
        once learned: its fixed cost and its cost per token together, so that a unit slow in
        either shows, whatever prompt lengths it was fed (a fleet whose prompts are all one
        length never tells the two apart)."""
        return self.predict_ttft(1000, 0, 0)


def slow_prefill(per_k: Mapping[str, float], factor: float = 2.0) -> dict[str, float]:
    """Of the units' learned prefill seconds per thousand tokens (`prefill_per_ktoken`), those
    more than `factor` times the fleet's median (of at least three units, so that one slow unit
    of two is not the median's half): each with its ratio to the median."""
    if len(per_k) < 3:
        return {}
    median = statistics.median(per_k.values())
    if median <= 0:
        return {}
    return {u: f / median for u, f in per_k.items() if f > factor * median}


def lag_reason(per_k: Mapping[str, float], unit: str, factor: float) -> str | None:
    """Why `unit`'s prefill lags the fleet's (slow_prefill), or None if it does not."""
    if factor <= 0:
        return None
    ratio = slow_prefill(per_k, factor).get(unit)
    if ratio is None:
        return None
    return (
        f"its time to first token for 1,000 uncached prompt tokens, {per_k[unit]:.3g} s as"
        f" learned from its answers, is {ratio:.1f}x the fleet's median"
    )
